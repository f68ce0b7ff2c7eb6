"""The order of a joint pass's writes (bandwidth/rebalance.py), so the
cluster's sum never passes a cap on the way: every channel whose agents may
apply more than its new budget is written before the cluster scale is raised,
and before any channel grows.

What a policy's agents may apply is told by what its channel last said, not
by its status: the policy's own reconcile writes the status from the new
budget before the joint pass runs, while its channel still holds the old
one. An agent applies min(the channel's budget, claim × its namespace's
factor); a cut the factor carries (the cluster cap's, on a channel written
with the claim it is to carry) needs no channel write, any other cut does
(its class's cap, its own change, an agent that reads no claim, a claim
that moved with its namespace's heaviest weight, a scale not in place).
Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Key = tuple[str, str]
#: What a channel last said: (its budget, the claim it carried or None);
#: None when this replica has not written it.
Written = tuple[int, int | None] | None


@dataclass(frozen=True)
class Target:
    """A policy's new budget, and whether the cluster scale carries its cut."""

    budget: float
    carried: bool
    #: The claim its channel carries under its namespace's new factor, the
    #: scale in place (bandwidth/share_channel.py `claims`); None: none.
    claim: int | None = None


def targets(joint: Mapping[Key, tuple[Any, Any, Any]],
            factors: Mapping[str, float],
            placed: Callable[[str], bool] = lambda _: True) -> dict[Key, Target]:
    """Each policy's Target from the joint budgets (key → (sizing, cluster
    share, policy)), its namespace's factor, and whether its namespace's
    scale was placed (a scale that failed to be written carries no cut)."""
    return {key: Target(sized.allowed_bandwidth, share.carried,
                        share.claim_under(factors[key[0]]) if placed(key[0]) else None)
            for key, (sized, share, _) in joint.items()}


def _cut_by_factor(written: tuple[int, int | None], target: Target) -> bool:
    return target.carried and written[1] is not None and written[1] == target.claim


def behind(written: Written, target: Target) -> bool:
    """The channel must be rewritten for its agents to apply `target`: it
    grows, it shrinks by a cut no factor carries, its claim moved, or it is
    not known."""
    if written is None or (written[1] is not None and written[1] != target.claim):
        return True  # not known, or its claim would have the factor mislead it
    budget = max(1, int(target.budget))
    return budget > written[0] or (budget < written[0] and not _cut_by_factor(written, target))


def held(before: float | None, written: Written, target: Target) -> float:
    """What the policy's agents may apply before the pass: the last joint
    pass's budget, or its channel's budget where that is larger and no
    factor cuts it; for a channel this process has not written, at least
    its new budget (what it holds is unknown: it goes out before a raise)."""
    held_now = before or 0.0
    if written is None:
        return max(held_now, target.budget)
    if target.budget < written[0] \
            and not _cut_by_factor(written, target):
        held_now = max(held_now, float(written[0]))
    return held_now


@dataclass(frozen=True)
class Step:
    key: Key
    #: The scale is raised before this step: every shrink is out.
    raise_first: bool
    #: The channel must be rewritten whatever the status says.
    rewrite: bool


def plan(targets: Mapping[Key, Target], before: Mapping[Key, float],
         written: Mapping[Key, Written]) -> tuple[list[Step], bool]:
    """The steps, shrinks first (the largest first), then raises; and
    whether any step raises (else the scale is raised after the last)."""
    moves = {key: t.budget - held(before.get(key), written.get(key), t)
             for key, t in targets.items()}
    steps, raised = [], False
    for key in sorted(targets, key=lambda k: moves[k]):
        first = not raised and moves[key] > 0
        raised = raised or first
        steps.append(Step(key, first, behind(written.get(key), targets[key])))
    return steps, raised
