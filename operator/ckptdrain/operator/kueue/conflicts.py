"""The conflicts between Kueue's settings and a policy's, found from what
was read (Kueue's `waitForPodsReady`, the policy's Workloads, their
flavours' node labels) and said as the policy's KueueCompatible condition.
Pure: the reads and writes are report.py's.

- WaitForPodsReadyTooShort: Kueue evicts a job whose pods are not all Ready
  within `timeout` of admission (`recoveryTimeout` after one stops being
  Ready); a restore that retries its store for `spec.restore.retryDeadline`,
  then moves a checkpoint, keeps the pod not Ready that long.
- EvictedWhileRestoring: a Workload Kueue evicts for PodsReadyTimeout
  (`Evicted` True), or holds back after that eviction (`Requeued` False with
  that reason, until its backoff ends). Not `status.requeueState`: Kueue
  v0.13.5 sets it for an admission check's eviction too and clears it only
  on deactivation, so one eviction would be a conflict for the Workload's life.
- FlavorOutsidePlacement: an admitted Workload's flavour whose `nodeLabels`
  rule out every term of the policy's `spec.placement` (policy/placement_fit.py),
  or set a key of its class's `spec.nodeTier.nodeSelector` to another value.
- QuotaExcludesInjected: Kueue counts `spec.podSets[].template` times
  `count`; the containers the webhook adds later are not in it unless the
  template's `overhead` covers them (a RuntimeClass's `overhead.podFixed`,
  which Kueue copies into the template).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ckptdrain import units
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.kueue.settings import WaitForPodsReady
from ckptdrain.operator.policy import placement_fit
from ckptdrain.quantity import parse_quantity

CONDITION = "KueueCompatible"
#: KueueCompatible True.
COMPATIBLE = "NoConflictKnown"
#: KueueCompatible False, the most urgent first (the condition's reason is
#: the first found; its message names every conflict).
EVICTED = "EvictedWhileRestoring"
TOO_SHORT = "WaitForPodsReadyTooShort"
FLAVOR = "FlavorOutsidePlacement"
QUOTA = "QuotaExcludesInjected"
REASONS = (EVICTED, TOO_SHORT, FLAVOR, QUOTA)

#: Kueue v0.13.5's Workload conditions and reason for the eviction: Evicted
#: True while evicted; Requeued False while it waits out the backoff after.
EVICTED_CONDITION, REQUEUED_CONDITION = "Evicted", "Requeued"
PODS_READY_TIMEOUT = "PodsReadyTimeout"
#: Conflicts of one reason named in full in the condition's message; the
#: rest are counted and a few of their Workloads named.
NAMED = 3
#: The condition's message stays well under the 32 KiB Kubernetes allows
#: and readable in `kubectl describe`.
MESSAGE_MAX = 3000


@dataclass(frozen=True)
class PolicyFacts:
    """What the checks need of a policy, from its parsed spec and sizing."""

    retry_deadline_s: float
    #: One restore's time as sizing estimates it; None: no honest estimate.
    restore_s: float | None
    #: How restore_s was estimated, for the message.
    restore_basis: str
    #: The required node-selector terms spec.placement adds ([] : none).
    placement_terms: Sequence[Mapping[str, Any]] = ()
    #: Requests per pod of the injected containers that run beside the
    #: trainer (the agent, the peer sidecar), by resource.
    injected: Mapping[str, Fraction] = field(default_factory=dict)
    #: Which injected containers those are, for the message.
    injected_names: Sequence[str] = ()
    #: The same where a pod stays Guaranteed (its containers' `guaranteed`
    #: amounts; admission/resources.py); None: as `injected`.
    injected_guaranteed: Mapping[str, Fraction] | None = None
    #: The class's spec.nodeTier.nodeSelector its pods are given ({}: none),
    #: and the class's name, for the message.
    class_selector: Mapping[str, str] = field(default_factory=dict)
    class_name: str = ""


@dataclass(frozen=True)
class Conflict:
    reason: str
    message: str
    #: The Workload it concerns ("" for Kueue's configuration).
    workload: str = ""


def _seconds(value: float) -> str:
    return units.format_duration(value) if value > 0 else "0s"


def wait_for_pods_ready(wait: WaitForPodsReady | None, facts: PolicyFacts) -> list[Conflict]:
    """Kueue's timeouts against the time a restore may keep a pod not Ready:
    retryDeadline plus one restore (retryDeadline alone, said so, without
    an estimate)."""
    if wait is None or not wait.enabled:
        return []
    need = facts.retry_deadline_s + (facts.restore_s or 0.0)
    basis = (f"spec.restore.retryDeadline ({_seconds(facts.retry_deadline_s)}) plus one "
             f"restore ({facts.restore_basis}): {_seconds(need)}"
             if facts.restore_s is not None else
             f"spec.restore.retryDeadline ({_seconds(facts.retry_deadline_s)}; "
             f"{facts.restore_basis}, so a restore's own time is not added)")
    out = []
    for name, value in (("timeout", wait.timeout_s), ("recoveryTimeout",
                                                       wait.recovery_timeout_s)):
        if value is None or value > need:
            continue
        out.append(Conflict(TOO_SHORT, (
            f"Kueue's waitForPodsReady.{name} ({_seconds(value)}) is not above {basis}: "
            "Kueue evicts the job while its restore still retries or reads; raise "
            f"waitForPodsReady.{name} above {_seconds(need)} or lower "
            "spec.restore.retryDeadline")))
    return out


def _name(workload: Mapping[str, Any]) -> str:
    return str((workload.get("metadata") or {}).get("name") or "")


def evicted(workload: Mapping[str, Any]) -> Conflict | None:
    """A Workload evicted because its pods were not Ready in time, or held
    back after that eviction; a readmitted one is not."""
    conditions = (workload.get("status") or {}).get("conditions") or []

    def has(kind: str, status: str) -> bool:
        return any(c.get("type") == kind and c.get("status") == status
                   and c.get("reason") == PODS_READY_TIMEOUT for c in conditions)

    if has(EVICTED_CONDITION, "True"):
        seen = "is evicted"
    elif has(REQUEUED_CONDITION, "False"):
        seen = "waits to be requeued after its eviction"
    else:
        return None
    return Conflict(EVICTED, (
        f"Workload {_name(workload)} {seen} by Kueue for {PODS_READY_TIMEOUT}: its pods were "
        "not all Ready within waitForPodsReady's timeout, as while a restore retries or "
        "reads; raise Kueue's waitForPodsReady.timeout or lower spec.restore.retryDeadline"),
        _name(workload))


def flavors_of(workload: Mapping[str, Any], pod_sets: set[str] | None = None) -> list[str]:
    """The flavours an admitted Workload's pod sets (all, or those named)
    were given, each once, in order."""
    admission = (workload.get("status") or {}).get("admission") or {}
    out: list[str] = []
    for assignment in admission.get("podSetAssignments") or []:
        if pod_sets is not None and assignment.get("name") not in pod_sets:
            continue
        for flavor in (assignment.get("flavors") or {}).values():
            if flavor not in out:
                out.append(str(flavor))
    return out


def flavor_outside(workload: Mapping[str, Any], flavor: str,
                   node_labels: Mapping[str, str], facts: PolicyFacts) -> Conflict | None:
    """A flavour whose nodes cannot meet the policy's placement, or whose
    nodeLabels set a key of its class's nodeSelector to another value."""
    ruled_out = placement_fit.contradictions(facts.placement_terms, node_labels)
    clashes = [f"{k}={v}" for k, v in sorted(facts.class_selector.items())
               if k in node_labels and str(node_labels[k]) != v]
    if ruled_out is None and not clashes:
        return None
    labels = ", ".join(f"{k}={v}" for k, v in sorted(node_labels.items()))
    against, remedy = [], []
    if ruled_out is not None:
        wants = "; ".join(placement_fit.describe(r) for r in ruled_out)
        against.append(f"spec.placement.nodeAffinity ({wants})")
        remedy.append("spec.placement")
    if clashes:
        against.append(f"CheckpointClass {facts.class_name}'s spec.nodeTier.nodeSelector "
                       f"({', '.join(clashes)}), which its pods are given")
        remedy.append(f"CheckpointClass {facts.class_name}'s nodeSelector")
    return Conflict(FLAVOR, (
        f"Workload {_name(workload)} is admitted to ResourceFlavor {flavor}, whose "
        f"nodeLabels ({labels}) contradict {' and '.join(against)}: its pods "
        "stay Pending while holding quota; give the flavour nodes the placement allows, or "
        f"queue the job to a ClusterQueue whose flavours all meet {' and '.join(remedy)}"),
        _name(workload))


def _amounts(raw: Mapping[str, Any] | None) -> dict[str, Fraction]:
    out = {}
    for name, value in (raw or {}).items():
        try:
            out[str(name)] = parse_quantity(str(name), value)
        except InvalidInput:  # the apiserver decoded it; unreadable here: not counted
            continue
    return out


def _text(resource: str, amount: Fraction) -> str:
    if resource == "cpu":
        millis = amount * 1000
        return f"{millis.numerator // millis.denominator}m" if amount % 1 else str(int(amount))
    return units.format_quantity(int(amount))


def _listed(amounts: Mapping[str, Fraction]) -> str:
    return ", ".join(f"{k} {_text(k, v)}" for k, v in sorted(amounts.items()))


def uncounted(template: Mapping[str, Any], injected: Mapping[str, Fraction],
              names: Sequence[str]) -> dict[str, Fraction]:
    """Per pod, what the injected containers request beyond what the pod
    template already carries for them (its `overhead`; nothing missing
    where the template already holds the containers themselves)."""
    spec = template.get("spec") or {}
    present = {c.get("name") for key in ("containers", "initContainers")
               for c in spec.get(key) or []}
    if names and all(n in present for n in names):
        return {}
    overhead = _amounts(spec.get("overhead"))
    out = {}
    for resource, amount in injected.items():
        missing = amount - overhead.get(resource, Fraction(0))
        if missing > 0:
            out[resource] = missing
    return out


def quota(workload: Mapping[str, Any], pod_sets: Sequence[Mapping[str, Any]],
          facts: PolicyFacts, stays_guaranteed: Callable[[Mapping[str, Any]], bool] = (
              lambda _: False)) -> Conflict | None:
    """The injected requests Kueue's quota does not count, per pod and in
    total, over the Workload's pod sets that are the policy's;
    `stays_guaranteed(template)` picks the shape admission gives them."""
    per_set = []
    total: dict[str, Fraction] = {}
    for pod_set in pod_sets:
        template = pod_set.get("template") or {}
        injected = facts.injected
        if facts.injected_guaranteed is not None and stays_guaranteed(template):
            injected = facts.injected_guaranteed
        missing = uncounted(template, injected, facts.injected_names)
        if not missing:
            continue
        count = int(pod_set.get("count") or 0)
        for resource, amount in missing.items():
            total[resource] = total.get(resource, Fraction(0)) + amount * count
        per_set.append(f"{pod_set.get('name', '')}: {_listed(missing)} per pod × {count}")
    if not total:
        return None
    return Conflict(QUOTA, (
        f"Workload {_name(workload)}: Kueue's quota does not count the injected "
        f"{', '.join(facts.injected_names)} ({'; '.join(per_set)}; {_listed(total)} in all): "
        "leave that much free in the ClusterQueue's quota beyond what the job asks, or run "
        "the pods with a RuntimeClass whose overhead.podFixed covers the per-pod amounts "
        "(Kueue counts it; a pod's overhead without one is refused)"), _name(workload))


def _summary(ordered: Sequence[Conflict]) -> list[str]:
    """Each reason's first NAMED messages in full; beyond them, how many
    more Workloads, a few named."""
    out: list[str] = []
    for reason in REASONS:
        messages = list(dict.fromkeys(c.message for c in ordered if c.reason == reason))
        out += messages[:NAMED]
        rest = list(dict.fromkeys(c.workload or "Kueue" for c in ordered
                                  if c.reason == reason and c.message not in messages[:NAMED]))
        if rest:
            named = ", ".join(rest[:NAMED]) + (", …" if len(rest) > NAMED else "")
            out.append(f"{reason} also on {len(rest)} more Workloads ({named})")
    return out


def _capped(text: str) -> str:
    return text if len(text) <= MESSAGE_MAX else text[:MESSAGE_MAX - 1] + "…"


def condition(conflicts: Sequence[Conflict], notes: Sequence[str] = ()) -> dict[str, str]:
    """KueueCompatible's status, reason and message: False with the most
    urgent reason and the conflicts named (a few per reason, the rest
    counted), or True; `notes` say what was not checked, and then the
    message claims no more than what was."""
    said = "; ".join(notes)
    if not conflicts:
        message = ("no conflict with Kueue's settings found in what was checked; " + said
                   if notes else "no conflict with Kueue's settings known")
        return {"type": CONDITION, "status": "True", "reason": COMPATIBLE,
                "message": _capped(message)}
    ordered = sorted(conflicts, key=lambda c: (REASONS.index(c.reason), c.workload, c.message))
    return {"type": CONDITION, "status": "False", "reason": ordered[0].reason,
            "message": _capped("; ".join([*_summary(ordered), *notes]))}
