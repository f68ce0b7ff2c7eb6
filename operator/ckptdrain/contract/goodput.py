"""The goodput annotations: what each pod's agent and restore publish for the
operator's goodput accounting (goodput.py), parsed and written. Pure.

Where the data comes from (no per-checkpoint API write is added):

- the trainer's client keeps `<work>/.ckptdrain/progress` (client.py);
- the agent copies what matters of it into its pod's `ckptdrain.io/goodput`
  annotation twice per pod life (training started; flushed after SIGTERM),
  and the blocked seconds, the saves and the newest drain's overlap ride
  along the pending-bytes patch it already sends (`AgentView`), with the
  interval and target overlap the pod runs with: what checkpointing costs
  against the two rules (operator/goodput/cost.py);
- restore writes `ckptdrain.io/restore-result` on its pod, in the patch it
  already sends (`RestoreView`);
- the operator reads both from the pods (`pod_view`), with two times from
  the pod's status that the kubelet sets (when the pod got its node; when
  its containers finished), and folds them into `status.goodput`
  (goodput.py).

Every annotation is untrusted input: one that does not parse is ignored
(`parse_*` return None), never a crash.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ckptdrain.contract.api import (
    ANNOTATION_GOODPUT,
    ANNOTATION_RESTORE_RESULT,
    LABEL_READER,
    LABEL_WRITER,
)
from ckptdrain.jsonfile import parse_object

#: Completed steps (and when) the client remembers, for `lostSeconds`.
MAX_COMPLETED = 16
#: Longest reason kept from a restore (the status is API, not a log).
MAX_REASON = 300
RESTORED_OUTCOMES = ("restored", "reshard", "fresh_start", "disabled")


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _step(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _positive(value: Any) -> float | None:
    number = _num(value)
    return number if number is not None and number > 0 else None


def _nonnegative(value: Any) -> float | None:
    number = _num(value)
    return number if number is not None and number >= 0 else None


def _load(text: str | None) -> dict[str, Any] | None:
    return parse_object(text)


@dataclass(frozen=True)
class AgentView:
    """What the agent published about its trainer (`ckptdrain.io/goodput`)."""

    training_at: float | None = None
    first_step: int | None = None
    blocked_s: float = 0.0
    interrupted_at: float | None = None
    step: int | None = None
    step_s: float | None = None
    completed: tuple[tuple[int, float], ...] = ()
    newest_local: int | None = None
    newest_global: int | None = None
    #: Saves the trainer completed (blocked_s / saves: blocking per save).
    saves: int = 0
    #: The schedule this pod runs with: its local interval and target overlap.
    interval_s: float | None = None
    overlap_target: float | None = None
    #: The newest drained checkpoint: its step, drain seconds and overlap
    #: (drain seconds ÷ global interval).
    drained_step: int | None = None
    drain_s: float | None = None
    drain_overlap: float | None = None

    def to_json(self) -> str:
        return json.dumps({
            "trainingAt": self.training_at, "firstStep": self.first_step,
            "blockedSeconds": round(self.blocked_s, 3), "interruptedAt": self.interrupted_at,
            "step": self.step, "stepSeconds": self.step_s,
            "completed": {str(s): t for s, t in self.completed},
            "newestLocal": self.newest_local, "newestGlobal": self.newest_global,
            "saves": self.saves, "intervalSeconds": self.interval_s,
            "overlapTarget": self.overlap_target, "drainedStep": self.drained_step,
            "drainSeconds": None if self.drain_s is None else round(self.drain_s, 3),
            "drainOverlap": None if self.drain_overlap is None
            else round(self.drain_overlap, 6),
        }, sort_keys=True, separators=(",", ":"))

    def completed_at(self, step: int | None) -> float | None:
        return next((t for s, t in self.completed if s == step), None)


def parse_agent(text: str | None) -> AgentView | None:
    doc = _load(text)
    if doc is None:
        return None
    done = doc.get("completed")
    completed = tuple(sorted(
        (int(k), float(v)) for k, v in (done.items() if isinstance(done, dict) else [])
        if k.isdigit() and _num(v) is not None))[-MAX_COMPLETED:]
    return AgentView(
        training_at=_num(doc.get("trainingAt")), first_step=_step(doc.get("firstStep")),
        blocked_s=max(0.0, _num(doc.get("blockedSeconds")) or 0.0),
        interrupted_at=_num(doc.get("interruptedAt")), step=_step(doc.get("step")),
        step_s=_num(doc.get("stepSeconds")), completed=completed,
        newest_local=_step(doc.get("newestLocal")), newest_global=_step(doc.get("newestGlobal")),
        # Absent from an older agent's view: no figures, never a crash.
        saves=_step(doc.get("saves")) or 0, interval_s=_positive(doc.get("intervalSeconds")),
        overlap_target=_positive(doc.get("overlapTarget")),
        drained_step=_step(doc.get("drainedStep")), drain_s=_nonnegative(doc.get("drainSeconds")),
        drain_overlap=_nonnegative(doc.get("drainOverlap")))


def from_progress(progress: Mapping[str, Any], newest_local: int | None = None,
                  newest_global: int | None = None) -> AgentView:
    """The agent's view from the client's progress file (client.Progress.to_dict)."""
    view = parse_agent(json.dumps(dict(progress)))
    assert view is not None
    return AgentView(**{**view.__dict__, "newest_local": newest_local,
                        "newest_global": newest_global})


@dataclass(frozen=True)
class RestoreView:
    """What restore did for a pod (`ckptdrain.io/restore-result`)."""

    outcome: str
    started_at: float
    seconds: float
    step: int | None = None
    tier: str | None = None
    reason: str = ""
    attempts: int = 1
    #: When the restored step was captured (its manifest), for lost seconds.
    step_created: float | None = None
    #: With several writers, the ranks' decision: (round, step, why, detail).
    agreement: tuple[int, int | None, str, str] | None = None

    @property
    def failed(self) -> bool:
        return self.outcome not in RESTORED_OUTCOMES

    def to_json(self) -> str:
        return json.dumps({"outcome": self.outcome, "startedAt": self.started_at,
                           "seconds": round(self.seconds, 3), "step": self.step,
                           "tier": self.tier, "reason": self.reason[:MAX_REASON],
                           "attempts": self.attempts, "stepCreated": self.step_created,
                           "agreement": None if self.agreement is None else {
                               "round": self.agreement[0], "step": self.agreement[1],
                               "why": self.agreement[2],
                               "detail": self.agreement[3][:MAX_REASON]}},
                          sort_keys=True, separators=(",", ":"))


def parse_restore(text: str | None) -> RestoreView | None:
    doc = _load(text)
    if doc is None:
        return None
    outcome, started = doc.get("outcome"), _num(doc.get("startedAt"))
    if not isinstance(outcome, str) or started is None:
        return None
    tier = doc.get("tier")
    return RestoreView(outcome=outcome[:40], started_at=started,
                       seconds=max(0.0, _num(doc.get("seconds")) or 0.0),
                       step=_step(doc.get("step")),
                       tier=tier if tier in ("local", "global") else None,
                       reason=str(doc.get("reason") or "")[:MAX_REASON],
                       attempts=int(_num(doc.get("attempts")) or 1),
                       step_created=_num(doc.get("stepCreated")),
                       agreement=_agreement(doc.get("agreement")))


def _agreement(doc: Any) -> tuple[int, int | None, str, str] | None:
    if not isinstance(doc, dict):
        return None
    round_ = _step(doc.get("round"))
    why = doc.get("why")
    if round_ is None or why not in ("agreed", "fallback"):
        return None
    return round_, _step(doc.get("step")), why, str(doc.get("detail") or "")[:MAX_REASON]


@dataclass(frozen=True)
class PodView:
    """One pod of a policy, as far as goodput is concerned."""

    name: str
    writer: str | None
    agent: AgentView | None = None
    restore: RestoreView | None = None
    #: When the pod got its node (`status.startTime`: the kubelet took it,
    #: before pulling images): from then on the job holds this pod's resources.
    bound_at: float | None = None
    #: When a pod that ended (Succeeded or Failed) last had a container
    #: running; None while it has not ended.
    finished_at: float | None = None
    #: Whether the pod ended (it holds no resources any more).
    finished: bool = False
    #: The shard a reader reads (its LABEL_READER); None for a writer. A
    #: reader's restore is no writer's recovery, but a failed one is reported.
    reader: str | None = None


def _time(value: Any) -> float | None:
    """Unix seconds of a pod status time: RFC 3339 as the apiserver sends it,
    or as the Python client re-serializes it (`+00:00`); None otherwise."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def lifecycle(status: Mapping[str, Any] | None) -> tuple[float | None, float | None, bool]:
    """(bound_at, finished_at, finished) from a pod's status, as PodView holds them."""
    status = status or {}
    finished = status.get("phase") in ("Succeeded", "Failed")
    ends = [_time(((c.get("state") or {}).get("terminated") or {}).get("finishedAt"))
            for c in status.get("containerStatuses") or [] if isinstance(c, Mapping)]
    known = [t for t in ends if t is not None]
    return _time(status.get("startTime")), (max(known) if finished and known else None), \
        finished


def pod_view(name: str, meta: Mapping[str, Any],
             status: Mapping[str, Any] | None = None) -> PodView | None:
    """A pod's goodput view from its metadata (and status, for when it got its
    node and ended); None when it carries neither annotation."""
    ann = meta.get("annotations") or {}
    agent = parse_agent(ann.get(ANNOTATION_GOODPUT))
    restore = parse_restore(ann.get(ANNOTATION_RESTORE_RESULT))
    if agent is None and restore is None:
        return None
    bound, finished_at, finished = lifecycle(status)
    labels = meta.get("labels") or {}
    return PodView(name=name, writer=labels.get(LABEL_WRITER), agent=agent, restore=restore,
                   bound_at=bound, finished_at=finished_at, finished=finished,
                   reader=labels.get(LABEL_READER))
