"""Whether each pod a policy selects is protected: the census behind the
policy's `status.pods` and its `Ready` condition. Pure: no Kubernetes, the
clock is passed in.

A live pod (not finished, not being deleted) that a policy selects is one of:

    protected    injected, and its agent (the native sidecar `ckptdrain-agent`)
                 runs; after a restart, once it has run steadily for
                 STEADY_S; a reader, which has no agent, once the pod runs
    waiting      injected, and not scheduled yet (scheduling gates such as
                 Kueue's or a gang scheduler's, no node fits): nothing runs,
                 so nothing is lost; it does not hold Ready back
    starting     injected and scheduled, the agent not running yet: images
                 are pulled, or restore runs before the agent; for at most
                 the starting limit (CKPTDRAIN_STARTING_LIMIT) after the pod
                 was scheduled. Also an agent that exited or waits after a
                 restart, for RESTART_GRACE_S after it ended (a restart is
                 not yet a crash loop), and one running again within
                 STEADY_S of its restart that came back within that grace.
                 And an agent waiting for the init containers again after
                 the pod's sandbox restarted (restore runs again first), for
                 the starting limit after it ended, and running again
                 within STEADY_S of coming back within that limit
    unprotected  not injected (admitted while admission was off, or labelled
                 after creation); or injected but its agent exited or
                 crash-loops for longer than RESTART_GRACE_S (and while it
                 runs again within STEADY_S: a crash loop's runs are short,
                 so Ready changes once per loop, not on every backoff); or
                 starting for longer than the starting limit. A reader,
                 which has no agent to fail, never counts unprotected.

An agent whose last exit has no finishedAt (its node rebooted) ended, as far
as the census knows, at the pod's last condition change. An agent first seen
down after a short run that was not its first (the operator restarted mid
crash loop) is in an outage already under way: unprotected at once.

A policy selects an injected pod when the pod was injected for it (the
`ckptdrain.io/policy` annotation admission sets), and a bare opted-in pod
when its selector matches the pod's labels (as admission/sweep.py does).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
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
#: How long an agent running again after a restart must run before it
#: counts protected: longer than the short runs of a crash loop.
STEADY_S = 2 * RESTART_GRACE_S
#: Agent states (`PodView.agent`): running, not yet running, down (after an
#: exit), or waiting for the init containers to run again (a sandbox restart).
RUNNING, WAITING, DOWN, REINIT = "running", "waiting", "down", "reinit"


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
    #: When the agent last ended (its lastState or state terminated), for an
    #: agent that ever did; None: unknown.
    agent_ended: datetime | None = None
    #: How often the agent restarted.
    agent_restarts: int = 0
    #: When the agent's container started running this time; None: unknown.
    agent_started: datetime | None = None
    #: How long the agent's last run lasted before its last exit; None: unknown.
    agent_last_run_s: float | None = None
    uid: str = ""
    #: Whether the agent runs again after the pod's sandbox restarted (the
    #: census saw it wait for the init containers): restore ran first, as
    #: long as a first start may.
    after_reinit: bool = False


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
    restarted = (found.get("restartCount") or 0) > 0
    if waiting.get("reason") == "PodInitializing" and restarted:
        return REINIT  # the sandbox restarted: the init containers run first
    if waiting.get("reason") == "CrashLoopBackOff" or restarted:
        return DOWN
    return WAITING


def _agent_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    return next((s for s in statuses if s.get("name") == AGENT), None) or {}


def _last_run_s(pod: Mapping[str, Any]) -> float | None:
    found = _agent_status(pod)
    for key in ("state", "lastState"):
        ran = (found.get(key) or {}).get("terminated") or {}
        start, end = _time(ran.get("startedAt")), _time(ran.get("finishedAt"))
        if start is not None and end is not None:
            return (end - start).total_seconds()
    return None


def continued(previous: PodView | None, current: PodView) -> PodView:
    """`current`, its outage dated from when it began: a crash loop is one
    outage across its short runs (none lasting STEADY_S), so the grace runs
    from the loop's first exit, not from each one, and its verdict changes
    once per loop. An agent running again after the same exit it waited
    for the init containers from is `after_reinit`. What the census saw
    before (`previous`) tells."""
    dated = _dated(previous, current)
    if previous is not None and previous.uid == current.uid \
            and current.agent in (RUNNING, REINIT) \
            and (previous.agent == REINIT or previous.after_reinit) \
            and dated.agent_ended == previous.agent_ended:
        return replace(dated, after_reinit=True)
    return dated


def _dated(previous: PodView | None, current: PodView) -> PodView:
    if previous is None or previous.uid != current.uid:
        return _first_sight(current)
    if not current.agent_restarts \
            or previous.agent_ended is None or current.agent_ended is None \
            or previous.agent_ended >= current.agent_ended:
        return current
    ran = current.agent_last_run_s
    if ran is None and previous.agent == RUNNING and previous.agent_started is not None:
        ran = (current.agent_ended - previous.agent_started).total_seconds()
    # The run that just ended, by its own times (the kubelet raises
    # restartCount only when the agent starts again, not at its exit).
    if ran is not None and ran >= STEADY_S:
        return current  # it ran steadily in between: a new outage
    return replace(current, agent_ended=previous.agent_ended)


def _first_sight(current: PodView) -> PodView:
    """`current`, seen with no history (the operator restarted, or the pod
    is new to it): an agent down after a short run that was not its first
    is in a crash loop already under way, whose first exit the census never
    saw. Its outage is dated a grace before its last exit: unprotected now,
    not given a fresh grace, and not protected between its backoffs."""
    ran = current.agent_last_run_s
    if current.agent == DOWN and current.agent_restarts and ran is not None \
            and ran < STEADY_S and current.agent_ended is not None:
        return replace(current,
                       agent_ended=current.agent_ended - timedelta(seconds=RESTART_GRACE_S))
    return current


def _agent_ended(pod: Mapping[str, Any]) -> datetime | None:
    """When the agent's container last terminated; None when it never did.
    An exit without finishedAt (a node reboot) ended at the pod's last
    condition change, when known."""
    found = _agent_status(pod)
    exits = [(found.get(k) or {}).get("terminated") for k in ("state", "lastState")]
    exits = [e for e in exits if isinstance(e, Mapping)]
    ended = [_time(e.get("finishedAt")) for e in exits]
    if any(t is None for t in ended):
        changes = [_time(c.get("lastTransitionTime"))
                   for c in (pod.get("status") or {}).get("conditions") or []]
        ended.append(max((t for t in changes if t is not None), default=None))
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
    status = _agent_status(pod) if agent is not None else {}
    restarts = int(status.get("restartCount") or 0)
    running = ((status.get("state") or {}).get("running") or {}) if agent == RUNNING else {}
    # An injected pod is selected by its annotation: its labels are not kept.
    return PodView(name=meta.get("name", ""),
                   labels={} if injected else dict(meta.get("labels") or {}),
                   policy=annotations.get(api.ANNOTATION_POLICY) if injected else None,
                   injected=injected, agent=agent,
                   phase=phase, created=_time(meta.get("creationTimestamp")),
                   scheduled=scheduled, scheduled_at=scheduled_at,
                   agent_ended=_agent_ended(pod) if agent in (DOWN, REINIT) or restarts
                   else None, agent_restarts=restarts,
                   agent_started=_time(running.get("startedAt")) if restarts else None,
                   agent_last_run_s=_last_run_s(pod) if restarts else None,
                   uid=str(meta.get("uid") or ""))


def _since(start: datetime | None, now: datetime) -> float:
    return 0.0 if start is None else (now - start).total_seconds()


def classify(pod: PodView, now: datetime, limit_s: float = STARTING_LIMIT_S) -> str:
    """PROTECTED, UNSCHEDULED, STARTING or UNPROTECTED (the module's docstring)."""
    if not pod.injected:
        return UNPROTECTED  # it will run without an agent, scheduled or not
    ended = pod.agent_ended
    if pod.agent == DOWN:
        # An ending time unknown is no grace: the agent is down for good.
        return STARTING if ended is not None and _since(ended, now) < RESTART_GRACE_S \
            else UNPROTECTED
    if pod.agent == REINIT:
        # Restore runs again before the agent: as long as a first start may.
        since = ended or pod.scheduled_at or pod.created
        return UNPROTECTED if _since(since, now) > limit_s else STARTING
    if pod.agent == RUNNING and pod.agent_restarts and pod.agent_started is not None \
            and _since(pod.agent_started, now) < STEADY_S:
        # Not yet steady: as it counted when it came back (a crash loop's
        # runs never show it protected between its backoffs).
        back_in_grace = ended is not None \
            and _since(ended, pod.agent_started) < RESTART_GRACE_S
        if pod.after_reinit:  # restore ran first: as long as a first start may
            back_in_grace = _since(ended or pod.scheduled_at or pod.created,
                                   pod.agent_started) <= limit_s
        return STARTING if back_in_grace else UNPROTECTED
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
