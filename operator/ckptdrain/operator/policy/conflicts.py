"""Policies of one namespace whose selectors overlap, and the Conflicting
condition that says so. Pure.

Admission refuses a policy that overlaps another (admission/policy_rules.py);
what slips through (the webhook not answering, two creates at the same
instant) the operator finds afterwards and marks on both policies, since
every pod both select is refused at pod admission. Only pods labelled
`ckptdrain.io/inject=true` are ever injected, so two selectors that meet
only on pods without that label do not conflict.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ckptdrain.contract.api import LABEL_INJECT
from ckptdrain.operator.policy import selectors
from ckptdrain.operator.policy import status as st

CONFLICTING = st.CONFLICTING
#: What every injected pod carries besides what its policy selects.
OPTED_IN = {"matchLabels": {LABEL_INJECT: "true"}}
#: One other policy and a label set both pick.
Overlap = tuple[str, dict[str, str]]


def _name(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("name") or "")


def first_overlap(name: str, selector: Mapping[str, Any],
                  others: Sequence[Mapping[str, Any]]) -> Overlap | None:
    """The first other policy (by name) whose selector picks an opted-in pod
    `selector` also picks, with such a pod's labels; None when there is none.
    The policy itself (named `name`) is not another; one being deleted is,
    as pod admission counts it until it is gone; a malformed selector stored
    before picks nothing."""
    for body in sorted(others, key=_name):
        other = (body.get("spec") or {}).get("selector")
        if _name(body) == name or not isinstance(other, Mapping):
            continue
        try:
            witness = selectors.common(selector, other, OPTED_IN)
        except ValueError:
            continue
        if witness is not None:
            return _name(body), witness
    return None


def deleting(name: str, bodies: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the policy `name` among `bodies` is being deleted."""
    return any(_name(b) == name and (b.get("metadata") or {}).get("deletionTimestamp")
               for b in bodies)


def find(bodies: Sequence[Mapping[str, Any]]) -> dict[str, Overlap | None]:
    """For each policy of one namespace, the first other it overlaps (None:
    none). Overlap is symmetric: both policies of a pair name one another
    (or a third they overlap first)."""
    graph = Overlaps()
    for body in bodies:
        graph.update(_name(body), body)
    return {_name(body): graph.first(_name(body)) for body in bodies}


#: What decides a policy's overlaps: its selector (comparable text) and
#: whether it is being deleted. Status changes leave it alone.
Key = tuple[str, bool]


def key_of(body: Mapping[str, Any]) -> Key:
    return (json.dumps((body.get("spec") or {}).get("selector"), sort_keys=True),
            bool((body.get("metadata") or {}).get("deletionTimestamp")))


class Overlaps:
    """Which policies of one namespace overlap which, kept up to date one
    policy at a time: an event whose selector and deletion mark are as last
    seen costs one comparison of keys; one that changed them compares that
    policy with each other once (never every pair, which at a thousand
    policies is seconds of CPU per event). Not thread-safe: the caller
    holds a lock."""

    def __init__(self) -> None:
        self._keys: dict[str, Key] = {}
        self._selectors: dict[str, Mapping[str, Any] | None] = {}
        #: name -> each other it overlaps -> a label set both pick (both ways).
        self._pairs: dict[str, dict[str, dict[str, str]]] = {}

    def update(self, name: str, body: Mapping[str, Any]) -> set[str]:
        """Take the policy's current body; returns the policies whose first
        overlap may have changed (it and those it overlapped before or
        overlaps now), empty when its key did not change."""
        key = key_of(body)
        if self._keys.get(name) == key:
            return set()
        touched = self._drop(name) | {name}
        selector = (body.get("spec") or {}).get("selector")
        selector = selector if isinstance(selector, Mapping) else None
        self._keys[name], self._selectors[name] = key, selector
        mine: dict[str, dict[str, str]] = {}
        for other, theirs in self._selectors.items() if selector is not None else ():
            if other == name or theirs is None:
                continue
            try:
                witness = selectors.common(selector, theirs, OPTED_IN)
            except ValueError:  # a malformed selector stored before picks nothing
                continue
            if witness is not None:
                mine[other] = witness
                self._pairs.setdefault(other, {})[name] = witness
        self._pairs[name] = mine
        return touched | set(mine)

    def remove(self, name: str) -> set[str]:
        """Forget a deleted policy; returns those it overlapped."""
        self._keys.pop(name, None)
        self._selectors.pop(name, None)
        return self._drop(name)

    def first(self, name: str) -> Overlap | None:
        """The first other (by name) `name` overlaps, with a label set both pick."""
        pairs = self._pairs.get(name)
        if not pairs:
            return None
        other = min(pairs)
        return other, pairs[other]

    def _drop(self, name: str) -> set[str]:
        before = self._pairs.pop(name, {})
        for other in before:
            self._pairs.get(other, {}).pop(name, None)
        return set(before)


def labels_text(labels: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in labels.items()) or "(no labels)"


def message(overlap: Overlap | None) -> str:
    if overlap is None:
        return "no other CheckpointPolicy of the namespace selects the same pods"
    other, witness = overlap
    return (f"spec.selector overlaps CheckpointPolicy {other}: a pod labelled "
            f"{labels_text(witness)} is selected by both, and pod admission refuses every "
            "such pod; make the selectors exclusive or delete one policy")


def with_conflict(current: Mapping[str, Any], overlap: Overlap | None,
                  generation: int | None, now: datetime) -> dict[str, Any] | None:
    """Status patch (conditions and phase) setting Conflicting; None when
    unchanged (no patch either when there is no conflict and never was)."""
    conditions = list(current.get("conditions") or [])
    before = next((c for c in conditions if c.get("type") == CONFLICTING), None)
    text = message(overlap)
    if before is None and overlap is None:
        return None
    sized = any(c.get("type") == st.READY for c in conditions)
    if before is not None and before.get("message") == text \
            and before.get("observedGeneration") == generation \
            and (not sized or current.get("phase") == st.phase(conditions)):
        return None
    new = st.condition(CONFLICTING, overlap is not None,
                       "SelectorOverlap" if overlap else "NoOverlap", text, generation, now,
                       conditions)
    kept = [*(c for c in conditions if c.get("type") != CONFLICTING), new]
    patch: dict[str, Any] = {"conditions": kept}
    if sized:
        patch["phase"] = st.phase(kept)  # a policy not sized yet gets it from sizing
    return patch
