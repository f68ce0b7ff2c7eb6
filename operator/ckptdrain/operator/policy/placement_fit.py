"""Whether node labels (a ResourceFlavor's `nodeLabels`, a CheckpointClass's
`spec.nodeTier.nodeSelector`) contradict a required node affinity (a
policy's `spec.placement`, Kubernetes' NodeSelectorTerm shapes). Pure.

A flavour's nodes carry its `nodeLabels` (Kueue adds them to the pods'
nodeSelector). A requirement on a key those labels set either holds for
that value or cannot hold on any of the flavour's nodes; a requirement on
a key they do not set, and every matchFields entry (node fields are no
labels), is unknown: some node of the flavour may meet it, so it never
counts against the flavour. So is a requirement Kubernetes refuses (In
without values, DoesNotExist with some): its own validation names it.
Terms are ORed: the flavour contradicts the affinity only when every term
has a requirement that cannot hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _whole(text: object) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


def _malformed(operator: object, values: Sequence[object]) -> bool:
    """A requirement the apiserver refuses (Kubernetes' NodeSelectorRequirement
    validation): In and NotIn need values, Exists and DoesNotExist take none,
    Gt and Lt take exactly one."""
    return ((operator in ("In", "NotIn") and not values)
            or (operator in ("Exists", "DoesNotExist") and bool(values))
            or (operator in ("Gt", "Lt") and len(values) != 1))


def holds(requirement: Mapping[str, Any], labels: Mapping[str, str]) -> bool | None:
    """Whether one matchExpressions entry holds on a node with `labels`
    (as the scheduler reads it); None when `labels` do not set its key, and
    for a requirement Kubernetes refuses: the apiserver says what is wrong
    with it, better than any conflict with these labels would."""
    key = requirement.get("key")
    operator = requirement.get("operator")
    raw = requirement.get("values")
    if raw is not None and not isinstance(raw, list | tuple):
        return None
    values = [str(v) for v in raw or []]
    if key not in labels or _malformed(operator, values):
        return None
    value = str(labels[key])
    if operator == "In":
        return value in values
    if operator == "NotIn":
        return value not in values
    if operator == "Exists":
        return True
    if operator == "DoesNotExist":
        return False
    if operator in ("Gt", "Lt"):
        have, bound = _whole(value), _whole(values[0])
        if have is None or bound is None:
            return False  # the scheduler matches no node whose value is not a number
        return have > bound if operator == "Gt" else have < bound
    return None  # an operator this code does not know: never a conflict


def contradiction(term: Mapping[str, Any], labels: Mapping[str, str]
                  ) -> Mapping[str, Any] | None:
    """The first matchExpressions entry of `term` that cannot hold on a node
    with `labels`; None when the term may hold."""
    for requirement in term.get("matchExpressions") or []:
        if holds(requirement, labels) is False:
            return requirement
    return None


def contradictions(terms: Sequence[Mapping[str, Any]], labels: Mapping[str, str]
                   ) -> list[Mapping[str, Any]] | None:
    """For required node affinity `terms` (ORed), the requirement that rules
    out each term when every term is ruled out by `labels`; None when some
    term may hold (or there is no term: no requirement at all)."""
    if not terms:
        return None
    found = [contradiction(term, labels) for term in terms]
    if any(r is None for r in found):
        return None
    return [r for r in found if r is not None]


def describe(requirement: Mapping[str, Any]) -> str:
    """A requirement as a person reads it: `zone In [a, b]`."""
    values = requirement.get("values")
    listed = f" [{', '.join(str(v) for v in values)}]" if values else ""
    return f"{requirement.get('key')} {requirement.get('operator')}{listed}"
