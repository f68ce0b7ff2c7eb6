"""operator/policy/allocation.py: budgets under a cluster cap (the split among a
policy's drainers is the share channel's: test_share_channel.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptdrain.operator.policy.allocation import (
    cluster_shares,
    joint_sizing,
    parse_annotation_number,
    policy_budgets,
)
from ckptdrain.sizing import SizingInput


def test_the_cluster_cap_is_split_fairly_not_by_what_each_declares() -> None:
    got = policy_budgets({"a": 60e9, "b": 20e9}, cluster_cap=40e9)
    assert got == {"a": pytest.approx(20e9), "b": pytest.approx(20e9)}
    # A small job gets all it wants; declaring more never takes a bigger part.
    assert policy_budgets({"a": 60e9, "b": 5e9}, 40e9) == {
        "a": pytest.approx(35e9), "b": pytest.approx(5e9)}
    assert policy_budgets({"a": 6000e9, "b": 25e9}, 40e9) == {
        "a": pytest.approx(20e9), "b": pytest.approx(20e9)}
    assert policy_budgets({"a": 60e9}, None) == {"a": 60e9}
    assert policy_budgets({"a": 10e9}, 40e9) == {"a": 10e9}


def test_a_sum_just_over_the_cap_by_rounding_is_not_a_crash() -> None:
    # fsum(1.7, 7.1, 8.0) is above this cap, the running sum is not.
    shares = cluster_shares({"a": 1.7, "b": 7.1, "c": 8.0}, 16.799999999999997)
    assert math.fsum(s.budget for s in shares.values()) == pytest.approx(16.8)


def test_weights_split_what_the_uncut_policies_leave() -> None:
    got = policy_budgets({"a": 100e9, "b": 100e9, "small": 4e9}, 40e9,
                         weights={"a": 3, "b": 1})
    assert got == {"a": pytest.approx(27e9), "b": pytest.approx(9e9),
                   "small": pytest.approx(4e9)}


def test_idle_policies_take_no_part_and_are_told_what_they_would_get() -> None:
    shares = cluster_shares({"a": 60e9, "b": 60e9, "idle": 60e9}, 40e9, counted={"a", "b"})
    assert shares["a"].budget == pytest.approx(20e9) and shares["a"].counted
    assert not shares["idle"].counted
    assert shares["idle"].budget == pytest.approx(40e9 / 3)  # once its pods run
    # Agents apply min(channel budget, claim × factor): the factor carries the level.
    assert shares["a"].factor == shares["idle"].factor
    assert shares["a"].claim * shares["a"].factor == pytest.approx(20e9)


@pytest.mark.parametrize(("text", "value"), [
    ("123", 123.0), (" 5e9 ", 5e9), ("-1", None), ("x", None), (None, None), ("nan", None)])
def test_annotation_numbers(text: object, value: float | None) -> None:
    assert parse_annotation_number(text) == value


def _ten_gbps(**kw: float) -> SizingInput:
    # 900 GB every 15 min at 10% overlap: 10 GB/s
    return SizingInput(checkpoint_bytes=900e9, interval_s=900, overlap=0.1, **kw)


def test_ten_policies_under_a_cluster_cap_each_get_a_tenth_and_say_so() -> None:
    joint = joint_sizing({f"p{i}": _ten_gbps(cluster_cap=40e9) for i in range(10)}, 40e9)
    assert len(joint) == 10
    for s, share in joint.values():
        assert s.required_bandwidth == pytest.approx(10e9)
        assert s.allowed_bandwidth == pytest.approx(4e9)
        assert s.bandwidth_constrained and s.binding_cap == "cluster"
        assert s.effective_overlap == pytest.approx(0.25)  # 900 GB at 4 GB/s: 225 s of 900
        assert share.scaled and share.total_wanted == pytest.approx(100e9)
    assert sum(s.allowed_bandwidth for s, _ in joint.values()) == pytest.approx(40e9)


def test_the_fair_split_applies_after_each_policy_cap() -> None:
    joint = joint_sizing({"capped": _ten_gbps(policy_cap=2e9), "free": _ten_gbps()}, 6e9)
    # wanted 2 + 10 = 12 GB/s under 6: the capped one's 2 is under its fair 3,
    # so it keeps them; the other gets the 4 left, cut by the cluster cap
    assert joint["capped"][0].allowed_bandwidth == pytest.approx(2e9)
    assert joint["capped"][0].binding_cap == "policy"
    assert joint["free"][0].allowed_bandwidth == pytest.approx(4e9)
    assert joint["free"][0].binding_cap == "cluster"


def test_a_cap_the_policies_fit_together_binds_no_one() -> None:
    joint = joint_sizing({"a": _ten_gbps(cluster_cap=40e9), "b": _ten_gbps(cluster_cap=40e9),
                          "capped": _ten_gbps(policy_cap=3e9, cluster_cap=40e9)}, 40e9)
    assert not joint["a"][0].bandwidth_constrained and not joint["a"][1].scaled
    assert joint["a"][0].allowed_bandwidth == pytest.approx(10e9)
    assert joint["capped"][0].binding_cap == "policy"


def test_one_policy_alone_over_the_cap_is_cut_to_the_cap() -> None:
    joint = joint_sizing({"big": _ten_gbps()}, 4e9)
    assert joint["big"][0].allowed_bandwidth == pytest.approx(4e9)
    assert joint["big"][0].binding_cap == "cluster"


def test_invalid_policies_are_left_out_of_the_joint_budget() -> None:
    joint = joint_sizing({"ok": _ten_gbps(), "bad": SizingInput(interval_s=900)}, 5e9)
    assert set(joint) == {"ok"} and joint["ok"][0].allowed_bandwidth == pytest.approx(5e9)


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.floats(1e9, 1e13), min_size=1, max_size=30), st.floats(1e8, 1e12))
def test_joint_budgets_never_sum_over_the_cluster_cap(sizes: list[float], cap: float) -> None:
    joint = joint_sizing({i: SizingInput(checkpoint_bytes=b, interval_s=900)
                          for i, b in enumerate(sizes)}, cap)
    total = sum(s.allowed_bandwidth for s, _ in joint.values())
    assert total <= cap * (1 + 1e-9)
    assert all(s.bandwidth_constrained == share.scaled for s, share in joint.values())


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.tuples(st.floats(1e6, 1e13), st.integers(1, 50), st.booleans()),
                min_size=1, max_size=25), st.floats(1e8, 1e12))
def test_the_split_is_weighted_max_min_fair(policies: list[tuple[float, int, bool]],
                                            cap: float) -> None:
    wanted = {i: w for i, (w, _, _) in enumerate(policies)}
    weights = {i: k for i, (_, k, _) in enumerate(policies)}
    counted = {i for i, (_, _, c) in enumerate(policies) if c}
    shares = cluster_shares(wanted, cap, counted, weights)
    running = {i: shares[i] for i in counted}
    assert math.fsum(s.budget for s in running.values()) <= cap * (1 + 1e-9)
    assert all(s.budget <= s.wanted * (1 + 1e-12) for s in shares.values())
    for s in running.values():
        # A policy cut by the cap gets at least as much per unit of weight as
        # anyone: nobody's part could grow without shrinking a smaller one.
        if s.budget < s.wanted * (1 - 1e-9):
            assert all(s.budget / s.weight >= o.budget / o.weight * (1 - 1e-9)
                       for o in running.values())
        # Agents apply the scale as min(channel budget, claim × factor).
        assert min(s.budget, s.claim * s.factor) == pytest.approx(s.budget, rel=1e-9)
        assert 0 < s.factor <= 1
    for i in set(wanted) - counted:
        # What an idle policy is told is what it gets once its pods run.
        joined = cluster_shares(wanted, cap, counted | {i}, weights)[i].budget
        assert shares[i].budget == pytest.approx(joined, rel=1e-9)


def test_a_claim_is_taken_only_under_a_factor_of_its_own_level() -> None:
    shares = cluster_shares({"a": 60e9, "b": 60e9}, 40e9, weights={"a": 1, "b": 3})
    light, heavy = shares["a"], shares["b"]
    # Under the heaviest's factor at the same level: its part, 1/3 of CLAIM.
    assert light.claim_under(heavy.factor) == int(1e18 / 3)
    assert heavy.claim_under(heavy.factor) == int(1e18)
    # A factor taken at another level (the cap moved since) says nothing of
    # its part, however close the weight it would stand for is to a whole one.
    other = cluster_shares({"a": 60e9, "b": 60e9}, 50e9, weights={"a": 1, "b": 3})["b"]
    assert light.claim_under(other.factor) is None
    assert light.claim_under(heavy.factor * 1.01) is None
