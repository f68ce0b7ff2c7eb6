"""Where a CheckpointClass's pods may run (`spec.nodeTier.nodeSelector`,
`spec.nodeTier.tolerations`): read from the class, and what a selected
pod gets of it at admission. Pure, no Kubernetes.

The node tier (the CSI driver's DaemonSet, or the hostPath root) exists
only on the nodes the platform prepared; a pod scheduled elsewhere waits
for a driver that is not there, or writes to another disk. The class says
which nodes those are, in Kubernetes' own shapes:

    pod nodeSelector   {gpu: h100}          class {pool: nvme}
        └── merged ──▶ {gpu: h100, pool: nvme}
    pod nodeSelector   {pool: hdd}          class {pool: nvme}
        └── refused: spec.nodeSelector.pool can never be nvme
    pod required node affinity              class {pool: nvme}
      terms [pool In [hdd]] OR [gpu Exists]
        └── admitted: the second term may hold on a class node
      terms [pool In [hdd]] OR [pool NotIn [nvme]]
        └── refused: each term names the requirement ruling it out
    policy spec.placement  pool In [hdd]    class {pool: nvme}
        └── the policy refused: none of the class's nodes meets it
    pod tolerations    [t1]                 class [t1, t2]
        └── added ──▶ [t1, t2] (an identical toleration is not added again)

Read when a pod is admitted: a class change reaches new pods only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptdrain.errors import InvalidInput
from ckptdrain.operator.policy import placement_fit, selectors
from ckptdrain.operator.policy.fields import MAX_PLACEMENT_ITEMS, Reader, check_toleration

FIELD = "spec.nodeTier"
#: Where a pod's own required node affinity is written.
AFFINITY_FIELD = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
#: The CRD's maxProperties of nodeSelector (its rules' cost is per entry).
MAX_SELECTOR = 64


@dataclass(frozen=True)
class Placement:
    """The class's nodeSelector (sorted pairs) and tolerations, as written."""

    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[dict[str, Any], ...] = ()


#: A class that says nothing of placement: pods keep their own.
ANYWHERE = Placement()


def read_placement(node_tier: object, problems: list[InvalidInput]) -> Placement:
    """The class's placement; each problem, naming its field, appended."""
    tier = node_tier if isinstance(node_tier, Mapping) else {}
    selector, tolerations = tier.get("nodeSelector"), tier.get("tolerations")
    found = len(problems)
    if selector is not None and not isinstance(selector, Mapping):
        problems.append(InvalidInput(f"{FIELD}.nodeSelector",
                                     "a map of node label keys to values", selector))
        selector = None
    if selector and len(selector) > MAX_SELECTOR:
        problems.append(InvalidInput(f"{FIELD}.nodeSelector", f"at most {MAX_SELECTOR} entries",
                                     f"{len(selector)} entries"))
    for key, value in (selector or {}).items():
        if not selectors.valid_key(key):
            problems.append(InvalidInput(f"{FIELD}.nodeSelector",
                                         "node label keys, each " + selectors.KEY_EXPECTED, key))
        elif not isinstance(value, str) or not selectors.valid_value(value):
            problems.append(InvalidInput(f"{FIELD}.nodeSelector.{key}",
                                         selectors.VALUE_EXPECTED, value))
    if tolerations is not None and not isinstance(tolerations, list):
        problems.append(InvalidInput(f"{FIELD}.tolerations", "a list of tolerations",
                                     tolerations))
    elif tolerations is not None:
        if len(tolerations) > MAX_PLACEMENT_ITEMS:
            problems.append(InvalidInput(f"{FIELD}.tolerations",
                                         f"at most {MAX_PLACEMENT_ITEMS} items",
                                         f"{len(tolerations)} items"))
        reader = Reader({})
        for i, toleration in enumerate(tolerations):
            check_toleration(reader, f"nodeTier.tolerations[{i}]", toleration, key_required=True)
        problems += reader.errors
    if len(problems) > found:
        return ANYWHERE
    return Placement(tuple(sorted((selector or {}).items())),
                     tuple(dict(t) for t in tolerations or ()))


def conflicts(pod_spec: Mapping[str, Any], placement: Placement, class_name: str
              ) -> list[InvalidInput]:
    """What in the pod's own spec keeps it off the class's nodes, each
    naming the field, the class and what was expected: a nodeSelector entry
    setting a class key to another value, and, when no term of its required
    node affinity can hold on the class's nodes, the requirement ruling out
    each term."""
    own = pod_spec.get("nodeSelector") or {}
    return [InvalidInput(f"spec.nodeSelector.{key}",
                         f"{value!r} or unset: CheckpointClass {class_name} runs its pods "
                         f"only on nodes labelled {key}={value} ({FIELD}.nodeSelector), "
                         "where its node tier is", own[key])
            for key, value in placement.node_selector if key in own and own[key] != value] \
        + _affinity_outside(pod_spec, placement, class_name)


def _affinity_outside(pod_spec: Mapping[str, Any], placement: Placement, class_name: str
                      ) -> list[InvalidInput]:
    # Malformed shapes are the apiserver's to refuse: a term or requirement
    # not as Kubernetes writes it counts as one that may hold.
    required = _path(pod_spec, "affinity", "nodeAffinity",
                     "requiredDuringSchedulingIgnoredDuringExecution")
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    if not placement.node_selector or not isinstance(terms, list):
        return []
    labels = dict(placement.node_selector)
    ruled_out = placement_fit.contradictions([_readable(term) for term in terms], labels)
    out = []
    for i, requirement in enumerate(ruled_out or []):
        j = next(j for j, r in enumerate(terms[i]["matchExpressions"]) if r is requirement)
        key = requirement["key"]
        out.append(InvalidInput(
            f"{AFFINITY_FIELD}.nodeSelectorTerms[{i}].matchExpressions[{j}]",
            f"a requirement nodes labelled {key}={labels[key]} meet: CheckpointClass "
            f"{class_name} runs its pods only there ({FIELD}.nodeSelector), where its node "
            "tier is, and no term of the pod's required node affinity can hold there",
            placement_fit.describe(requirement)))
    return out


def _path(doc: object, *keys: str) -> object:
    for key in keys:
        doc = doc.get(key) if isinstance(doc, Mapping) else None
    return doc


def _readable(term: object) -> Mapping[str, Any]:
    """`term` with only its well-formed matchExpressions (the same objects);
    an empty term (one that never rules out) when it is no mapping."""
    exprs = term.get("matchExpressions") if isinstance(term, Mapping) else None
    if not isinstance(exprs, list):
        return {}
    return {"matchExpressions": [
        r for r in exprs if isinstance(r, Mapping) and isinstance(r.get("key"), str)
        and isinstance(r.get("operator"), str)
        and (r.get("values") is None or isinstance(r.get("values"), list))]}


def policy_outside(spec: Mapping[str, Any], placement: Placement, class_name: str
                   ) -> list[InvalidInput]:
    """The policy's own `spec.placement` requirements that no node of the
    class meets (a class key it requires another value of): its pods
    would stay Pending forever. Malformed entries are the policy parser's."""
    affinity = (spec.get("placement") or {}).get("nodeAffinity") \
        if isinstance(spec.get("placement"), Mapping) else None
    exprs = affinity.get("matchExpressions") if isinstance(affinity, Mapping) else None
    if not placement.node_selector or not isinstance(exprs, list):
        return []
    labels = dict(placement.node_selector)
    out = []
    for i, requirement in enumerate(exprs):
        if not isinstance(requirement, Mapping) or not isinstance(requirement.get("key"), str) \
                or placement_fit.holds(requirement, labels) is not False:
            continue
        key = requirement.get("key")
        out.append(InvalidInput(
            f"spec.placement.nodeAffinity.matchExpressions[{i}]",
            f"a requirement nodes labelled {key}={labels[key]} meet: CheckpointClass "
            f"{class_name} runs its pods only there ({FIELD}.nodeSelector), so this "
            "policy's pods would stay Pending forever", placement_fit.describe(requirement)))
    return out


def stranded(pods: Iterable[tuple[str, Mapping[str, str]]], placement: Placement,
             class_name: str) -> str | None:
    """For a class's placement just changed, one line for the live pods
    (name, nodeSelector) of one of its policies that set a class key to
    another value: their replacements are refused if their workload's
    template sets that key itself. None when no pod does. One line per
    policy, not per pod: a job of thousands of pods gets one Event."""
    wanted = dict(placement.node_selector)
    hit = [(pod, key, own[key]) for pod, own in pods for key, value in wanted.items()
           if key in own and own[key] != value]
    if not hit:
        return None
    names = sorted({pod for pod, _, _ in hit})
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    keys = sorted({key for _, key, _ in hit})
    seen = ", ".join(sorted({f"{key}={old}" for _, key, old in hit})[:5])
    gives = ", ".join(f"{key}={wanted[key]}" for key in keys)
    return (f"{len(names)} live pod(s) ({shown}) have nodeSelector {seen} but CheckpointClass "
            f"{class_name} now gives {gives} ({FIELD}.nodeSelector): a replacement from a "
            f"template that sets {', '.join(keys)} itself is refused; drop it from the template")


def selector_additions(pod_spec: Mapping[str, Any], placement: Placement) -> dict[str, str]:
    """The class's nodeSelector entries the pod lacks (after `conflicts`)."""
    own = pod_spec.get("nodeSelector") or {}
    return {key: value for key, value in placement.node_selector if key not in own}


def _same(toleration: Mapping[str, Any]) -> tuple[Any, ...]:
    # As the apiserver reads one: a missing operator is Equal, a missing
    # key, value or effect is empty.
    return (toleration.get("key") or "", toleration.get("operator") or "Equal",
            toleration.get("value") or "", toleration.get("effect") or "",
            toleration.get("tolerationSeconds"))


def tolerations_to_add(have: Sequence[Mapping[str, Any]] | None,
                       wanted: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`wanted` in order, less those identical to one the pod has or to an
    earlier one of `wanted`."""
    seen = {_same(t) for t in have or ()}
    out = []
    for toleration in wanted:
        if _same(toleration) not in seen:
            seen.add(_same(toleration))
            out.append(dict(toleration))
    return out
