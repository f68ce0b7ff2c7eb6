"""What checkpointing costs the job, against the two rules it is sized by. Pure.

- **Blocking**: the time the trainer is blocked per save should be at most
  5% of the checkpoint interval (the long-standing rule for checkpoint
  overhead). Ranks save together and the step waits for the slowest, so
  the rule is judged on the worst pod: its mean blocking per save ÷ its
  local interval.
- **Overlap**: a drain should take at most the policy's target overlap of
  the global interval (`spec.overlap`, the sizing model's overlap). The
  checkpoint is global when its last writer is done, so the rule is judged
  on the worst pod's newest drain.

The figures come from the pods' goodput views (contract/goodput.py: the
trainer's saves and blocked seconds, the newest drain, the interval and
target each pod runs with) and go into `status.checkpointCost`. The status
is rewritten only when a rule's verdict flips or a figure moved by more
than CHANGE (`changed`); a pod's event asks for a fold only when its own
figures moved that much (`pod_signature`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from ckptdrain.contract.goodput import PodView

#: Blocking per save, at most this fraction of the checkpoint interval.
BLOCKING_BUDGET = 0.05
#: A figure that moved by less than this (relative) is not worth a status patch.
CHANGE = 0.10
WITHIN, EXCEEDS, UNKNOWN = "Within", "Exceeds", "Unknown"
#: The figures whose movement counts (the rest follow them or are counts).
_FIGURES = ("blockingPerSaveSeconds", "worstBlockingPerSaveSeconds", "blockingFraction",
            "drainOverlap", "drainSeconds")
#: Settings: any change counts.
_SETTINGS = ("intervalSeconds", "targetOverlap", "blockingBudget", "blockingRule",
             "overlapRule")


def _blocking(pod: PodView) -> tuple[float, float] | None:
    """(mean blocking per save, that ÷ the pod's interval) of a pod whose
    trainer completed a save and whose interval is known; None otherwise."""
    a = pod.agent
    if a is None or a.saves <= 0 or a.interval_s is None or pod.reader is not None:
        return None
    per_save = a.blocked_s / a.saves
    return per_save, per_save / a.interval_s


def _verdict(value: float | None, limit: float | None) -> str:
    if value is None or limit is None:
        return UNKNOWN
    return EXCEEDS if value > limit else WITHIN


def checkpoint_cost(pods: Iterable[PodView]) -> dict[str, Any] | None:
    """`status.checkpointCost` from the pods' views; None while no pod has
    saved or drained (nothing is known yet)."""
    pods = [p for p in pods if p.agent is not None and p.reader is None]
    saving = [(p, b) for p in pods if (b := _blocking(p)) is not None]
    drained = [p for p in pods if p.agent is not None and p.agent.drain_overlap is not None]
    if not saving and not drained:
        return None
    out: dict[str, Any] = {"blockingBudget": BLOCKING_BUDGET}
    if saving:
        saves = sum(p.agent.saves for p, _ in saving)  # type: ignore[union-attr]
        blocked = sum(p.agent.blocked_s for p, _ in saving)  # type: ignore[union-attr]
        worst, (per_save, fraction) = max(saving, key=lambda pb: pb[1][1])
        out.update({
            "pods": len(saving), "saves": saves,
            "blockingPerSaveSeconds": round(blocked / saves, 3),
            "worstBlockingPerSaveSeconds": round(per_save, 3),
            "worstBlockingPod": worst.name,
            "intervalSeconds": worst.agent.interval_s,  # type: ignore[union-attr]
            "blockingFraction": round(fraction, 5),
        })
    out["blockingRule"] = _verdict(out.get("blockingFraction"), BLOCKING_BUDGET)
    target = None
    if drained:
        late = max(drained, key=lambda p: p.agent.drain_overlap)  # type: ignore[union-attr,return-value]
        a = late.agent
        assert a is not None and a.drain_overlap is not None
        target = a.overlap_target
        out.update({"drainOverlap": round(a.drain_overlap, 5), "drainOverlapPod": late.name,
                    "drainedStep": a.drained_step,
                    "drainSeconds": None if a.drain_s is None else round(a.drain_s, 3),
                    "targetOverlap": target})
    out["overlapRule"] = _verdict(out.get("drainOverlap"), target)
    return out


def _moved(old: Any, new: Any) -> bool:
    if old is None or new is None:
        return old is not new
    old, new = float(old), float(new)
    return abs(new - old) > CHANGE * max(abs(old), abs(new))


def changed(current: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether `new` is worth a status patch over `current`: a verdict or a
    setting differs, or a figure moved by more than CHANGE. Counts and pod
    names alone (saves go up at every checkpoint) are not."""
    if new is None:
        return False
    if not current:
        return True
    return (any(current.get(k) != new.get(k) for k in _SETTINGS)
            or any(_moved(current.get(k), new.get(k)) for k in _FIGURES))


def _bucket(value: float | None) -> int | None:
    """Which CHANGE-wide step of a log scale `value` falls in."""
    if value is None or value <= 0:
        return None if value is None else -(10 ** 6)
    return math.floor(math.log(value) / math.log1p(CHANGE))


def pod_signature(pod: PodView) -> tuple[Any, ...]:
    """What of one pod's view `checkpoint_cost` depends on, coarsely: a pod
    event changes it only when the pod's own blocking per save or overlap
    moved by about CHANGE, or its schedule changed; most of its checkpoints
    then cost the operator no pass over the policy's pods."""
    a = pod.agent
    if a is None:
        return ()
    blocking = _blocking(pod)
    return (a.interval_s, a.overlap_target, None if blocking is None else _bucket(blocking[0]),
            _bucket(a.drain_overlap))
