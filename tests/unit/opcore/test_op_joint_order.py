"""The joint pass's order of writes (bandwidth/joint_order.py): channels
decided by what they last said, shrinks before the scale is raised."""

from __future__ import annotations

from ckptdrain.operator.bandwidth import joint_order as jo

A, B = ("a", "A"), ("b", "B")


def test_a_channel_is_rewritten_when_it_grows_or_a_cut_is_not_the_factors() -> None:
    assert jo.behind(None, jo.Target(10e6, carried=True))  # never written here
    assert jo.behind((10_000_000, True), jo.Target(20e6, carried=True))  # grows
    assert not jo.behind((10_000_000, True), jo.Target(10e6, carried=False))  # the same
    # A cut the factor carries, on a channel with a claim: the scale's.
    assert not jo.behind((50_000_000, True), jo.Target(10e6, carried=True))
    # Its class's cut (or its own change): no factor says it.
    assert jo.behind((50_000_000, True), jo.Target(10e6, carried=False))
    # Its agents read no claim: only the channel bounds them.
    assert jo.behind((50_000_000, False), jo.Target(10e6, carried=True))


def test_a_channel_above_its_new_budget_counts_as_a_shrink_whatever_the_last_pass_said() -> None:
    # The last joint pass gave A 33M (its channel still says 100M, the
    # factor cut it); now its class cuts it to 40M: a shrink from 100M.
    assert jo.held(33e6, (100_000_000, True), jo.Target(40e6, carried=False)) == 100e6
    assert jo.held(33e6, (100_000_000, True), jo.Target(40e6, carried=True)) == 33e6
    steps, raised = jo.plan({A: jo.Target(40e6, carried=False), B: jo.Target(60e6, carried=True)},
                            {A: 33e6, B: 33e6}, {A: (100_000_000, True), B: (100_000_000, True)})
    assert [(s.key, s.raise_first, s.rewrite) for s in steps] == [
        (A, False, True), (B, True, False)]
    assert raised


def test_nothing_grows_so_the_scale_is_raised_after_the_last_step() -> None:
    steps, raised = jo.plan({A: jo.Target(10e6, carried=True)}, {A: 20e6},
                            {A: (100_000_000, True)})
    assert [(s.raise_first, s.rewrite) for s in steps] == [(False, False)] and not raised


def test_a_policy_whose_factor_is_not_its_namespaces_leaves_no_cut_to_the_scale() -> None:
    # A lighter policy's factor is its namespace's; a heavier one's channel
    # carries its whole budget: a claim would have the smaller factor cut it.
    heavy = jo.Target(60e6, carried=True, claimable=False)
    assert jo.behind((60_000_000, True), heavy)  # its claim is dropped
    assert not jo.behind((60_000_000, False), heavy)
    assert jo.behind((75_000_000, False), heavy)  # a shrink the factor does not carry
    assert jo.held(20e6, (75_000_000, False), heavy) == 75e6
