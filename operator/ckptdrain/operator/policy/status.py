"""A policy's status as API: sizing fields, a short phase, and conditions
(Ready, Degraded, BandwidthConstrained, ResourcesAdjusted) with reason, message and
observedGeneration. Pure: the clock is passed in.

Ready is True when the spec is valid and no selected pod runs unprotected.
Two passes write it through `ready()`: the sizing pass (for_sizing,
for_invalid), which owns the spec's verdict and counts the pods from the
census index as it writes (so the first Ready it writes is already right),
and the pod census (policy/readiness.py), which owns the pods' verdict
between spec changes and never touches an invalid policy's Ready. The census
rebuilds the sizing message from the status' sizing fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ckptdrain import units
from ckptdrain.contract.api import timestamp
from ckptdrain.operator.policy.allocation import ClusterShare
from ckptdrain.operator.policy.constrained import verdict
from ckptdrain.sizing import Sizing

READY, DEGRADED, CONSTRAINED = "Ready", "Degraded", "BandwidthConstrained"
WRITERS_CONSISTENT = "WritersConsistent"
#: Another policy's selector overlaps this one's (policy/conflicts.py owns it).
CONFLICTING = "Conflicting"
OWN = (READY, DEGRADED, CONSTRAINED)
#: spec.resources amounts the platform's current max cuts at pod admission
#: (sizing owns it). Its own type: Degraded belongs to the stall watchdog,
#: whose alert and runbook are about drains.
ADJUSTED = "ResourcesAdjusted"
#: Selected pods that run without injection (the sweep owns this condition).
UNPROTECTED = "PodsUnprotected"
#: How many pod names the PodsUnprotected message lists (the count is exact).
MAX_NAMES = 10
#: Ready's reasons: valid and sized with every selected pod protected (or
#: none), an invalid spec (for_invalid), a selected pod unprotected (the census).
SIZED, INVALID, PODS_UNPROTECTED = "SizingComputed", "InvalidSpec", "PodsUnprotected"
#: Whether the policy's CheckpointClass takes it (policy/classes.py).
CLASS_RESOLVED = "ClassResolved"


def _others(previous: Sequence[Mapping[str, Any]], owned: set[str] | None = None
            ) -> list[dict[str, Any]]:
    """Conditions another writer owns (the sweep's, the writer check's), carried
    over unchanged when sizing rewrites its three."""
    owned = set(OWN) if owned is None else owned
    return [dict(c) for c in previous if c.get("type") not in owned]


def condition(kind: str, ok: bool, reason: str, message: str, generation: int | None,
              now: datetime, previous: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """One condition; lastTransitionTime moves only when the status flips."""
    status = "True" if ok else "False"
    before = next((c for c in previous if c.get("type") == kind), None)
    since = before.get("lastTransitionTime") if before and before.get("status") == status \
        else None
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": since or timestamp(now)}


def _true(conditions: Sequence[Mapping[str, Any]], kind: str, reason: str | None = None
          ) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               and (reason is None or c.get("reason") == reason) for c in conditions)


#: Every phase, the most urgent first (the CRD's enum, docs/operator.md).
PHASES = ("Invalid", "Conflicting", "Stalled", "Unprotected", "Constrained", "Ready")


def phase(conditions: Sequence[Mapping[str, Any]]) -> str:
    """The short phase the conditions add up to, the most urgent first:
    Invalid, Conflicting (policy/conflicts.py), Stalled, Unprotected (Ready
    False for pods: the census), Constrained, Ready."""
    if any(c.get("type") == READY and c.get("reason") == INVALID for c in conditions):
        return "Invalid"
    if _true(conditions, CONFLICTING):
        return "Conflicting"
    if _true(conditions, DEGRADED, "DrainStalled"):
        return "Stalled"
    if any(c.get("type") == READY and c.get("status") == "False"
           and c.get("reason") == PODS_UNPROTECTED for c in conditions):
        return "Unprotected"
    return "Constrained" if _true(conditions, CONSTRAINED) else "Ready"


def sizing_message(size: str, interval: str, rate: str, drainers: Any) -> str:
    """Ready's message on the happy path: what the sizing found."""
    return f"{size} every {interval} needs {rate}; {drainers} drainer(s)"


def sizing_summary(status: Mapping[str, Any]) -> str:
    """sizing_message from a status' sizing fields: the `Sized` Event's text,
    and Ready's once the census finds every pod protected again."""
    return sizing_message(status.get("checkpointSize"), status.get("globalInterval"),
                          status.get("requiredBandwidth"), status.get("drainers", 0))


def pods_message(unprotected: Sequence[str], selected: int) -> str:
    """Ready's message when selected pods run unprotected: how many of how
    many, and the first MAX_NAMES names."""
    names = ", ".join(sorted(unprotected)[:MAX_NAMES])
    more = f" and {len(unprotected) - MAX_NAMES} more" if len(unprotected) > MAX_NAMES else ""
    return (f"{len(unprotected)} of {selected} selected pod(s) run unprotected (not injected, "
            f"the agent down, or starting for too long): {names}{more}")


def ready(sizing: str, unprotected: Sequence[str] | None, selected: int,
          generation: int | None, now: datetime,
          previous: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Ready of a valid policy: True (SizingComputed, `sizing` as message)
    unless a selected pod runs unprotected (False, PodsUnprotected).
    `unprotected` None: the caller did not count pods (the sizing pass) and
    the census's last verdict stays as it was, observedGeneration included,
    until the census counts again."""
    before = next((c for c in previous if c.get("type") == READY), None)
    if unprotected is None:
        if before is not None and before.get("status") == "False" \
                and before.get("reason") == PODS_UNPROTECTED:
            return dict(before)
        return condition(READY, True, SIZED, sizing, generation, now, previous)
    if unprotected:
        return condition(READY, False, PODS_UNPROTECTED,
                         pods_message(unprotected, selected), generation, now, previous)
    return condition(READY, True, SIZED, sizing, generation, now, previous)


def sizing_fields(s: Sizing) -> dict[str, Any]:
    """The sizing model, in human units and in exact numbers."""
    fields: dict[str, Any] = {
        "checkpointSize": units.format_bytes(s.checkpoint_bytes),
        "checkpointBytes": int(s.checkpoint_bytes),
        "requiredBandwidth": units.format_rate(s.required_bandwidth),
        "requiredBandwidthBytes": int(s.required_bandwidth),
        "allowedBandwidth": units.format_rate(s.allowed_bandwidth),
        "allowedBandwidthBytes": int(s.allowed_bandwidth),
        "effectiveOverlap": units.format_percent(s.effective_overlap),
        "globalInterval": units.format_duration(s.global_interval_s),
        "drainTime": units.format_duration(s.drain_seconds),
        "drainers": s.drainers,
        "perDrainerBandwidth": units.format_rate(s.per_drainer_bandwidth),
        "recommendedInterval": None if s.recommended_interval_s is None
        else units.format_duration(s.recommended_interval_s),
        "youngDalyInterval": None if s.young_daly_interval_s is None
        else units.format_duration(s.young_daly_interval_s),
    }
    return fields


def _constrained(s: Sizing, cluster: ClusterShare | None, generation: int | None,
                 now: datetime, previous: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """BandwidthConstrained from the sizing under the joint budget
    (policy/constrained.py says which cap binds and why)."""
    constrained, reason, message = verdict(s, cluster)
    return condition(CONSTRAINED, constrained, reason, message, generation, now, previous)


def for_sizing(s: Sizing, generation: int | None, now: datetime,
               previous: Sequence[Mapping[str, Any]] = (), active_drainers: int = 0,
               cluster: ClusterShare | None = None,
               resource_notes: Sequence[str] = (),
               unprotected: Sequence[str] | None = None, selected: int = 0,
               class_resolved: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Status of a valid policy; `s` is its sizing under the joint budget
    (allocation.joint_sizing) and `cluster` its part of the cluster cap;
    `resource_notes` the spec.resources amounts the platform now cuts
    (ResourcesAdjusted: the pods get other amounts than the policy asks for);
    `unprotected` and `selected` the pod census under this spec (None: not
    counted, and a Ready the census turned False stays, see ready()).
    A stall the watchdog found stays: only the watchdog ends it."""
    constrained = _constrained(s, cluster, generation, now, previous)
    fields = sizing_fields(s)
    verdict = ready(sizing_message(fields["checkpointSize"], fields["globalInterval"],
                                   fields["requiredBandwidth"], active_drainers),
                    unprotected, selected, generation, now, previous)
    stalled = next((dict(c) for c in previous if c.get("type") == DEGRADED
                    and c.get("reason") == "DrainStalled" and c.get("status") == "True"), None)
    degraded = stalled or condition(DEGRADED, False, "AsExpected", "", generation, now,
                                    previous)
    adjusted = condition(ADJUSTED, True, "ResourcesClamped", "; ".join(resource_notes),
                         generation, now, previous) if resource_notes \
        else condition(ADJUSTED, False, "AsExpected", "", generation, now, previous)
    conditions = _with_class([verdict, degraded, constrained, adjusted,
                              *_others(previous, {READY, DEGRADED, CONSTRAINED, ADJUSTED})],
                             class_resolved, generation, now, previous)
    return {**fields, "observedGeneration": generation,
            "phase": phase(conditions), "conditions": conditions}


def with_cluster(current: Mapping[str, Any], s: Sizing, cluster: ClusterShare | None,
                 generation: int | None, now: datetime) -> dict[str, Any] | None:
    """Status patch when the joint allocation moved under a sized policy (another
    policy came, went or changed): the sizing fields, BandwidthConstrained and
    the phase; None when nothing a reader sees would change."""
    conditions = list(current.get("conditions") or [])
    if not conditions or current.get("phase") == "Invalid":
        return None
    fields = sizing_fields(s)
    del fields["drainers"]  # the live pod count, which the rebalance keeps
    new = _constrained(s, cluster, generation, now, conditions)
    before = next((c for c in conditions if c.get("type") == CONSTRAINED), {})
    same = all(current.get(k) == v for k, v in fields.items()) and all(
        before.get(k) == new[k] for k in ("status", "reason", "message"))
    if same:
        return None
    phase = current.get("phase")
    if phase in ("Ready", "Constrained"):  # a stall keeps its phase until it ends
        phase = "Constrained" if s.bandwidth_constrained else "Ready"
    kept = [new if c.get("type") == CONSTRAINED else c for c in conditions]
    return {**fields, "phase": phase,
            "conditions": kept if before else [*kept, new]}


def for_invalid(message: str, generation: int | None, now: datetime,
                previous: Sequence[Mapping[str, Any]] = (),
                class_resolved: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Status of a policy whose spec cannot be used."""
    return {"observedGeneration": generation, "phase": "Invalid", "conditions": _with_class([
        condition(READY, False, INVALID, message, generation, now, previous),
        condition(DEGRADED, True, "InvalidSpec", message, generation, now, previous),
        condition(CONSTRAINED, False, "InvalidSpec", "", generation, now, previous),
        condition(ADJUSTED, False, "InvalidSpec", "", generation, now, previous),
        *_others(previous, {READY, DEGRADED, CONSTRAINED, ADJUSTED}),
    ], class_resolved, generation, now, previous)}


def _with_class(conditions: list[dict[str, Any]], resolved: Mapping[str, str] | None,
                generation: int | None, now: datetime,
                previous: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`conditions` with ClassResolved as `resolved` says (policy/classes.py
    condition()); None: as it was."""
    if resolved is None:
        return conditions
    return [*(c for c in conditions if c.get("type") != CLASS_RESOLVED),
            condition(CLASS_RESOLVED, resolved["status"] == "True", resolved["reason"],
                      resolved["message"], generation, now, previous)]


def recovery_fields(last_local: int | None, last_global: int | None,
                    global_time: str | None) -> dict[str, Any]:
    """Recovery point: newest step per tier and when the newest global one completed."""
    return {"lastLocalStep": last_local, "lastGlobalStep": last_global,
            "recoveryPointTime": global_time}


#: A drain is stalled when no checkpoint completed globally for this many
#: global intervals (plus one drain time): a missed one can happen, two cannot.
STALL_INTERVALS = 2


def drain_stall(last_global: datetime | None, since: datetime, global_interval_s: float,
                drain_s: float, drainers: int, now: datetime) -> str | None:
    """Why the recovery point is too old, or None when it is fresh enough (or
    nothing runs that could drain)."""
    if drainers == 0:
        return None
    reference = last_global if last_global is not None and last_global > since else since
    allowed = STALL_INTERVALS * global_interval_s + drain_s
    age = (now - reference).total_seconds()
    if age <= allowed:
        return None
    what = "no checkpoint has completed globally" if last_global is None \
        else "the newest global checkpoint completed"
    return (f"{what} for {units.format_duration(age)} with {drainers} drainer(s); "
            f"expected one every {units.format_duration(global_interval_s)} "
            f"(stalled after {units.format_duration(allowed)})")


def with_stall(current: Mapping[str, Any], stall: str | None, generation: int | None,
               now: datetime) -> dict[str, Any] | None:
    """Status patch (phase and conditions) for a stall that began or ended; None if unchanged."""
    conditions = list(current.get("conditions") or [])
    before = next((c for c in conditions if c.get("type") == DEGRADED), None)
    if before is None or current.get("phase") == "Invalid":
        return None
    stalled_before = before.get("reason") == "DrainStalled" and before.get("status") == "True"
    if stall is None and not stalled_before:
        return None
    if stall is not None and stalled_before and before.get("message") == stall:
        return None
    degraded = condition(DEGRADED, stall is not None,
                         "DrainStalled" if stall else "AsExpected", stall or "", generation,
                         now, conditions)
    kept = [degraded if c.get("type") == DEGRADED else c for c in conditions]
    return {"phase": phase(kept), "conditions": kept}


def writers_check(pods: Sequence[tuple[str, str | None, int | None]],
                  writers: int) -> tuple[bool, str, str]:
    """(ok, reason, message) over a policy's live pods, each (name, writer
    rank, workload writer count): two pods holding one rank (admission was
    off, or both were admitted at once) or a workload that disagrees with
    spec.writers."""
    holders: dict[str, list[str]] = {}
    for name, rank, _ in pods:
        if rank is not None:
            holders.setdefault(rank, []).append(name)
    shared = {r: sorted(n) for r, n in holders.items() if len(n) > 1}
    if shared:
        text = "; ".join(f"writer {r} is held by pods {', '.join(n)}"
                         for r, n in sorted(shared.items(), key=lambda x: int(x[0])
                                            if x[0].isdigit() else -1))
        return False, "DuplicateWriter", (
            f"{text}: only the one holding the writer's lease commits; delete all but one")
    seen = sorted({(n, name) for name, _, n in pods if n is not None and n != writers})
    if seen:
        count, name = seen[0]
        return False, "WritersMismatch", (
            f"spec.writers is {writers} but pod {name}'s workload has {count} pods that "
            f"write; a checkpoint completes only when {writers} writers commit it")
    return True, "Consistent", f"{len(pods)} live pod(s), each its own writer"


def with_writers(current: Mapping[str, Any], check: tuple[bool, str, str],
                 generation: int | None, now: datetime) -> dict[str, Any] | None:
    """Status patch (conditions) setting WritersConsistent; None when unchanged
    or the policy has no sized status yet."""
    conditions = list(current.get("conditions") or [])
    if not conditions or current.get("phase") == "Invalid":
        return None
    ok, reason, message = check
    before = next((c for c in conditions if c.get("type") == WRITERS_CONSISTENT), None)
    if before is not None and before.get("status") == ("True" if ok else "False") \
            and before.get("reason") == reason and before.get("message") == message:
        return None
    new = condition(WRITERS_CONSISTENT, ok, reason, message, generation, now, conditions)
    return {"conditions": [c for c in conditions if c.get("type") != WRITERS_CONSISTENT]
            + [new]}


def unprotected_message(pods: Sequence[str]) -> str:
    """The count, the first MAX_NAMES names, and the remedy."""
    if not pods:
        return "every selected pod carries the ckptdrain injection"
    names = ", ".join(sorted(pods)[:MAX_NAMES])
    more = f" and {len(pods) - MAX_NAMES} more" if len(pods) > MAX_NAMES else ""
    return (f"{len(pods)} selected pod(s) run without injection (no restore, never "
            f"drained): {names}{more}. Delete them; their controllers recreate them "
            "through admission")


def with_unprotected(current: Mapping[str, Any], pods: Sequence[str],
                     generation: int | None, now: datetime) -> dict[str, Any] | None:
    """Status patch setting the PodsUnprotected condition; None if unchanged
    (no patch either when there is nothing to report and never was)."""
    conditions = list(current.get("conditions") or [])
    before = next((c for c in conditions if c.get("type") == UNPROTECTED), None)
    message = unprotected_message(pods)
    if before is None and not pods:
        return None
    if before is not None and before.get("message") == message:
        return None
    new = condition(UNPROTECTED, bool(pods), "AdmittedWithoutInjection" if pods
                    else "AllInjected", message, generation, now, conditions)
    kept = [c for c in conditions if c.get("type") != UNPROTECTED]
    return {"conditions": [*kept, new]}
