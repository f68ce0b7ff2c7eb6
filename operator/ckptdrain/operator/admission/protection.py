"""Whether each pod a policy selects is protected: the census behind the
policy's `status.pods` and its `Ready` condition. Pure: no Kubernetes, the
clock is passed in.

A live pod (not finished, not being deleted) that a policy selects is one of:

    protected    injected, and its agent (the native sidecar `ckptdrain-agent`)
                 runs; a reader, which has no agent, once the pod runs
    starting     injected, the agent not running yet: the pod is being
                 scheduled, pulls images, or restore runs before the agent;
                 for at most STARTING_LIMIT_S after the pod was created
    unprotected  not injected (admitted while admission was off, or labelled
                 after creation); or injected but its agent exited or
                 crash-loops; or starting for longer than STARTING_LIMIT_S

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
#: How long an injected pod may start before it counts as unprotected: long
#: enough for a large trainer image to be pulled and a checkpoint of tens of
#: GB to be restored before the agent starts, short enough that a pod stuck
#: in scheduling or restore shows on the policy within the hour.
STARTING_LIMIT_S = 600.0
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


def _agent_state(pod: Mapping[str, Any]) -> str | None:
    """The agent's state from the pod's status: RUNNING once its container
    runs and has started, DOWN when it exited or waits after a restart (a
    crash loop), WAITING otherwise; None when the pod has no agent."""
    spec = pod.get("spec") or {}
    if not any(c.get("name") == AGENT for c in spec.get("initContainers") or []):
        return None
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    found = next((s for s in statuses if s.get("name") == AGENT), None)
    if found is None:
        return WAITING
    state = found.get("state") or {}
    if "running" in state:
        return RUNNING if found.get("started") is not False else WAITING
    if "terminated" in state:
        return DOWN
    waiting = state.get("waiting") or {}
    if waiting.get("reason") == "CrashLoopBackOff" or (found.get("restartCount") or 0) > 0:
        return DOWN
    return WAITING


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
    # An injected pod is selected by its annotation: its labels are not kept.
    return PodView(name=meta.get("name", ""),
                   labels={} if injected else dict(meta.get("labels") or {}),
                   policy=annotations.get(api.ANNOTATION_POLICY) if injected else None,
                   injected=injected, agent=_agent_state(pod) if injected else None,
                   phase=phase, created=_time(meta.get("creationTimestamp")))


def classify(pod: PodView, now: datetime, limit_s: float = STARTING_LIMIT_S) -> str:
    """PROTECTED, STARTING or UNPROTECTED (see the module's docstring)."""
    if not pod.injected or pod.agent == DOWN:
        return UNPROTECTED
    if pod.agent == RUNNING or (pod.agent is None and pod.phase == "Running"):
        return PROTECTED
    if pod.created is not None and (now - pod.created).total_seconds() > limit_s:
        return UNPROTECTED
    return STARTING


@dataclass(frozen=True)
class Census:
    """One policy's selected pods, by protection."""
    protected: int = 0
    starting: int = 0
    #: The unprotected pods' names, sorted.
    unprotected: tuple[str, ...] = ()

    @property
    def selected(self) -> int:
        return self.protected + self.starting + len(self.unprotected)

    def counts(self) -> dict[str, int]:
        """`status.pods`."""
        return {"selected": self.selected, "protected": self.protected,
                "starting": self.starting, "unprotected": len(self.unprotected)}


def selects(policy: str, selector: Mapping[str, Any], pod: PodView) -> bool:
    """Whether the policy named `policy`, with `selector`, selects `pod`."""
    if pod.injected:
        return pod.policy == policy
    return pol.selector_matches(selector, pod.labels)


def tally(policy: str, selector: Mapping[str, Any], pods: Iterable[PodView],
          now: datetime, limit_s: float = STARTING_LIMIT_S) -> Census:
    """The census of the pods of one namespace that `policy` selects."""
    found: dict[str, list[str]] = {PROTECTED: [], STARTING: [], UNPROTECTED: []}
    for pod in pods:
        if selects(policy, selector, pod):
            found[classify(pod, now, limit_s)].append(pod.name)
    return Census(protected=len(found[PROTECTED]), starting=len(found[STARTING]),
                  unprotected=tuple(sorted(found[UNPROTECTED])))
