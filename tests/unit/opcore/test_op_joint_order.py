"""The joint pass's order of writes (bandwidth/joint_order.py): channels
decided by what they last said, shrinks before the scale is raised."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from ckptdrain.operator.bandwidth import joint_order as jo
from ckptdrain.operator.policy import allocation

A, B = ("a", "A"), ("b", "B")
C = int(allocation.CLAIM)


def test_a_channel_is_rewritten_when_it_grows_or_a_cut_is_not_the_factors() -> None:
    assert jo.behind(None, jo.Target(10e6, carried=True, claim=C))  # never written here
    assert jo.behind((10_000_000, C), jo.Target(20e6, carried=True, claim=C))  # grows
    assert not jo.behind((10_000_000, C), jo.Target(10e6, carried=False, claim=C))  # the same
    # A cut the factor carries, on a channel with its claim: the scale's.
    assert not jo.behind((50_000_000, C), jo.Target(10e6, carried=True, claim=C))
    # Its class's cut (or its own change): no factor says it.
    assert jo.behind((50_000_000, C), jo.Target(10e6, carried=False, claim=C))
    # Its agents read no claim: only the channel bounds them.
    assert jo.behind((50_000_000, None), jo.Target(10e6, carried=True, claim=C))


def test_a_channel_whose_claim_moved_is_rewritten_and_its_cut_is_not_the_factors() -> None:
    # Its namespace's heaviest draining weight moved: the claim it carries
    # no longer makes claim × factor its part.
    half = jo.Target(10e6, carried=True, claim=C // 2)
    assert jo.behind((10_000_000, C), half)
    assert jo.behind((50_000_000, C), half)
    assert jo.held(10e6, (50_000_000, C), half) == 50e6  # a shrink, not the scale's
    assert jo.held(10e6, (50_000_000, C // 2), half) == 10e6


def test_a_channel_above_its_new_budget_counts_as_a_shrink_whatever_the_last_pass_said() -> None:
    # The last joint pass gave A 33M (its channel still says 100M, the
    # factor cut it); now its class cuts it to 40M: a shrink from 100M.
    assert jo.held(33e6, (100_000_000, C), jo.Target(40e6, carried=False, claim=C)) == 100e6
    assert jo.held(33e6, (100_000_000, C), jo.Target(40e6, carried=True, claim=C)) == 33e6
    steps, raised = jo.plan({A: jo.Target(40e6, carried=False, claim=C),
                             B: jo.Target(60e6, carried=True, claim=C)},
                            {A: 33e6, B: 33e6}, {A: (100_000_000, C), B: (100_000_000, C)})
    assert [(s.key, s.raise_first, s.rewrite) for s in steps] == [
        (A, False, True), (B, True, False)]
    assert raised


def test_a_channel_this_process_never_wrote_goes_out_before_the_scale_rises() -> None:
    # A fresh process: what A's channel says is unknown (an older release's
    # budget and claim, say), so it is written before B grows the scale.
    assert jo.held(None, None, jo.Target(40e6, carried=True, claim=C)) == 40e6
    steps, raised = jo.plan({A: jo.Target(40e6, carried=True, claim=C),
                             B: jo.Target(60e6, carried=True, claim=C)},
                            {B: 30e6}, {B: (30_000_000, C)})
    assert [(s.key, s.raise_first, s.rewrite) for s in steps] == [
        (A, False, True), (B, True, True)]
    assert raised


def test_nothing_grows_so_the_scale_is_raised_after_the_last_step() -> None:
    steps, raised = jo.plan({A: jo.Target(10e6, carried=True, claim=C)}, {A: 20e6},
                            {A: (100_000_000, C)})
    assert [(s.raise_first, s.rewrite) for s in steps] == [(False, False)] and not raised


def test_a_policy_with_no_claim_leaves_no_cut_to_the_scale() -> None:
    # Its namespace's scale is not in place (or at another level): its
    # channel carries its whole budget.
    bare = jo.Target(60e6, carried=True, claim=None)
    assert jo.behind((60_000_000, C), bare)  # its claim is dropped
    assert not jo.behind((60_000_000, None), bare)
    assert jo.behind((75_000_000, None), bare)  # a shrink the factor does not carry
    assert jo.held(20e6, (75_000_000, None), bare) == 75e6


def _share(weight: int, level: float) -> allocation.ClusterShare:
    return allocation.ClusterShare(budget=weight * level, wanted=1e12, total_wanted=3e12,
                                   policies=3, cluster_cap=100e6, weight=weight,
                                   total_weight=4, level=level)


def _joint(**weights: int) -> dict[Any, Any]:
    """Namespace a's policies, each at its weight's part of one level."""
    return {("a", name): (SimpleNamespace(allowed_bandwidth=w * 25e6), _share(w, 25e6), None)
            for name, w in weights.items()}


def test_targets_claim_each_policys_part_of_its_namespaces_factor_where_the_scale_is_placed(
        ) -> None:
    joint = _joint(A1=1, A2=2)
    heaviest = joint[("a", "A2")][1].factor
    out = jo.targets(joint, {"a": heaviest})
    assert out[("a", "A2")].claim == C and out[("a", "A1")].claim == C // 2
    for key, (_, share, _) in joint.items():
        assert out[key].claim * heaviest == pytest.approx(share.weight * share.level)
    # The scale in namespace a failed to be written: no claim carries a cut.
    unplaced = jo.targets(joint, {"a": heaviest}, lambda _: False)
    assert all(t.claim is None for t in unplaced.values())
