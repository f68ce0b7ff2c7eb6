"""Whether each pod a policy selects is protected: the census behind the
policy's `status.pods` and its `Ready` condition. Pure: no Kubernetes, the
clock is passed in.

A live pod (not finished, not being deleted) that a policy selects is one of:

    protected    injected, and its agent (the native sidecar `ckptdrain-agent`)
                 runs; a reader, which has no agent, once the pod runs
    waiting      injected, and not scheduled yet (scheduling gates such as
                 Kueue's or a gang scheduler's, no node fits): nothing runs,
                 so nothing is lost; it does not hold Ready back
    starting     injected and scheduled, the agent not running yet: images
                 are pulled, or restore runs before the agent; for at most
                 the starting limit (CKPTDRAIN_STARTING_LIMIT) after the pod
                 was scheduled. Also an agent that exited or waits after a
                 restart, for RESTART_GRACE_S after it ended: a restart is
                 not yet a crash loop
    unprotected  not injected (admitted while admission was off, or labelled
                 after creation); or injected but its agent exited or
                 crash-loops for longer than RESTART_GRACE_S; or starting for
                 longer than the starting limit. A reader, which has no
                 agent to fail, never counts unprotected.

A policy selects an injected pod when the pod was injected for it (the
`ckptdrain.io/policy` annotation admission sets), and a bare opted-in pod
when its selector matches the pod's labels (as admission/sweep.py does).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ckptdrain.contract import api
from ckptdrain.operator.admission.injection import AGENT, is_injected
from ckptdrain.operator.policy import spec as pol

PROTECTED, STARTING, UNPROTECTED = "protected", "starting", "unprotected"
#: Not scheduled yet: `status.pods.waiting`.
UNSCHEDULED = "waiting"
#: How long a scheduled injected pod may start before it counts as
#: unprotected, by default (CKPTDRAIN_STARTING_LIMIT): long enough for a
#: large trainer image to be pulled and a checkpoint of tens of GB to be
#: restored before the agent starts, short enough that a pod stuck in
#: restore shows on the policy within the hour.
STARTING_LIMIT_S = 600.0
#: How long an agent that exited or waits after a restart counts as
#: starting: the kubelet restarts it within seconds, a crash loop's backoff
#: soon exceeds this.
RESTART_GRACE_S = 60.0
#: Agent states (`PodView.agent`): running, not yet running, or down for good.
RUNNING, WAITING, DOWN = "running", "waiting", "down"


@dataclass(frozen=True)
class PodView:
    """The few fields of a live opted-in pod the census needs."""
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    #: The policy the pod was injected for; None: a bare pod.
    policy: str | None = None
    injected: bool = False
    #: RUNNING, WAITING or DOWN; None: no agent (a reader).
    agent: str | None = WAITING
    #: The pod's phase (Pending, Running, ...).
    phase: str = "Pending"
    created: datetime | None = None
    #: Whether the pod has a node (or its PodScheduled condition is True).
    scheduled: bool = True
    #: When it was scheduled (PodScheduled's lastTransitionTime); None: unknown.
    scheduled_at: datetime | None = None
    #: When the agent last ended (its lastState or state terminated), for a
    #: DOWN agent; None: unknown.
    agent_ended: datetime | None = None


def _agent_state(pod: Mapping[str, Any]) -> str | None:
    """The agent's state from the pod's status: RUNNING once its container
    runs and has started, DOWN when it exited, or waits or has not started
    again after a restart (classify() gives it RESTART_GRACE_S), WAITING
    otherwise; None when the pod has no agent."""
    spec = pod.get("spec") or {}
    if not any(c.get("name") == AGENT for c in spec.get("initContainers") or []):
        return None
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    found = next((s for s in statuses if s.get("name") == AGENT), None)
    if found is None:
        return WAITING
    state = found.get("state") or {}
    if "running" in state:
        if found.get("started") is not False:
            return RUNNING
        # Not started after a restart: down, within the restart grace.
        return DOWN if (found.get("restartCount") or 0) > 0 else WAITING
    if "terminated" in state:
        return DOWN
    waiting = state.get("waiting") or {}
    if waiting.get("reason") == "CrashLoopBackOff" or (found.get("restartCount") or 0) > 0:
        return DOWN
    return WAITING


def _agent_ended(pod: Mapping[str, Any]) -> datetime | None:
    """When the agent's container last terminated; None when it never did."""
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    found = next((s for s in statuses if s.get("name") == AGENT), None) or {}
    ended = [_time(((found.get(k) or {}).get("terminated") or {}).get("finishedAt"))
             for k in ("state", "lastState")]
    return max((t for t in ended if t is not None), default=None)


def _scheduling(pod: Mapping[str, Any]) -> tuple[bool, datetime | None]:
    """Whether the pod is scheduled, and since when: a node assigned or
    PodScheduled True (at its lastTransitionTime)."""
    condition = next((c for c in (pod.get("status") or {}).get("conditions") or []
                      if c.get("type") == "PodScheduled"), None) or {}
    scheduled = bool((pod.get("spec") or {}).get("nodeName")) \
        or condition.get("status") == "True"
    at = _time(condition.get("lastTransitionTime")) if condition.get("status") == "True" \
        else None
    return scheduled, at


def _time(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def view(pod: Mapping[str, Any]) -> PodView | None:
    """What the census keeps of an opted-in pod; None for one that no
    longer needs protecting (finished, or being deleted)."""
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if meta.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
        return None
    injected = is_injected(pod)
    annotations = meta.get("annotations") or {}
    agent = _agent_state(pod) if injected else None
    scheduled, scheduled_at = _scheduling(pod)
    # An injected pod is selected by its annotation: its labels are not kept.
    return PodView(name=meta.get("name", ""),
                   labels={} if injected else dict(meta.get("labels") or {}),
                   policy=annotations.get(api.ANNOTATION_POLICY) if injected else None,
                   injected=injected, agent=agent,
                   phase=phase, created=_time(meta.get("creationTimestamp")),
                   scheduled=scheduled, scheduled_at=scheduled_at,
                   agent_ended=_agent_ended(pod) if agent == DOWN else None)


def _since(start: datetime | None, now: datetime) -> float:
    return 0.0 if start is None else (now - start).total_seconds()


def classify(pod: PodView, now: datetime, limit_s: float = STARTING_LIMIT_S) -> str:
    """PROTECTED, UNSCHEDULED, STARTING or UNPROTECTED (the module's docstring)."""
    if not pod.injected:
        return UNPROTECTED  # it will run without an agent, scheduled or not
    if pod.agent == DOWN:
        # An ending time unknown is no grace: the agent is down for good.
        ended = pod.agent_ended
        return STARTING if ended is not None and _since(ended, now) < RESTART_GRACE_S \
            else UNPROTECTED
    if pod.agent == RUNNING or (pod.agent is None and pod.phase == "Running"):
        return PROTECTED
    if not pod.scheduled:
        return UNSCHEDULED
    if pod.agent is None:
        return STARTING  # a reader: nothing of it runs unprotected
    if _since(pod.scheduled_at or pod.created, now) > limit_s:
        return UNPROTECTED
    return STARTING


@dataclass(frozen=True)
class Census:
    """One policy's selected pods, by protection."""
    protected: int = 0
    starting: int = 0
    #: Not scheduled yet.
    waiting: int = 0
    #: The unprotected pods' names, sorted.
    unprotected: tuple[str, ...] = ()

    @property
    def selected(self) -> int:
        return self.protected + self.starting + self.waiting + len(self.unprotected)

    def counts(self) -> dict[str, int]:
        """`status.pods`' counts."""
        return {"selected": self.selected, "protected": self.protected,
                "starting": self.starting, "waiting": self.waiting,
                "unprotected": len(self.unprotected)}


def selects(policy: str, selector: Mapping[str, Any], pod: PodView) -> bool:
    """Whether the policy named `policy`, with `selector`, selects `pod`."""
    if pod.injected:
        return pod.policy == policy
    return pol.selector_matches(selector, pod.labels)


def tally(policy: str, selector: Mapping[str, Any], pods: Iterable[PodView],
          now: datetime, limit_s: float = STARTING_LIMIT_S) -> Census:
    """The census of the pods of one namespace that `policy` selects."""
    found: dict[str, list[str]] = {PROTECTED: [], STARTING: [], UNSCHEDULED: [],
                                   UNPROTECTED: []}
    for pod in pods:
        if selects(policy, selector, pod):
            found[classify(pod, now, limit_s)].append(pod.name)
    return Census(protected=len(found[PROTECTED]), starting=len(found[STARTING]),
                  waiting=len(found[UNSCHEDULED]),
                  unprotected=tuple(sorted(found[UNPROTECTED])))
