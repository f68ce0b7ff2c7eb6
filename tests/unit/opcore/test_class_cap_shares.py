"""A CheckpointClass's cap on its policies together (policy/class_shares.py,
policy/allocation.py `cluster_shares`): within the class they share it by
weight, what it leaves goes to the others under the cluster cap, idle
policies count toward neither, and it binds with or without a cluster cap."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptdrain.operator.policy.allocation import cluster_shares, joint_sizing
from ckptdrain.operator.policy.class_shares import ClassCap
from ckptdrain.sizing import SizingInput

GOLD = ClassCap("gold", 30e9)


def test_a_capped_class_shares_its_cap_and_leaves_the_rest_to_the_others() -> None:
    shares = cluster_shares({"a": 40e9, "b": 40e9, "c": 100e9}, 100e9,
                            classes={"a": GOLD, "b": GOLD})
    assert shares["a"].budget == pytest.approx(15e9)
    assert shares["b"].budget == pytest.approx(15e9)
    # Work conserving: the 70 the class cannot take go to c, not a fair third.
    assert shares["c"].budget == pytest.approx(70e9)
    assert shares["a"].class_bound and not shares["c"].class_bound
    assert shares["a"].class_part is not None and shares["a"].class_part.name == "gold"
    assert shares["c"].class_part is None


def test_within_the_class_the_weights_split_the_cap() -> None:
    shares = cluster_shares({"a": 40e9, "b": 40e9}, None, weights={"a": 2, "b": 1},
                            classes={"a": GOLD, "b": GOLD})
    assert shares["a"].budget == pytest.approx(20e9)
    assert shares["b"].budget == pytest.approx(10e9)


def test_the_class_cap_binds_without_a_cluster_cap() -> None:
    shares = cluster_shares({"a": 40e9, "free": 40e9}, None, classes={"a": GOLD})
    assert shares["a"].budget == pytest.approx(30e9) and shares["a"].scaled
    assert shares["a"].class_bound and shares["a"].claim is None
    assert shares["free"].budget == pytest.approx(40e9) and not shares["free"].scaled


def test_a_class_under_its_cap_is_cut_by_the_cluster_cap_like_any_other() -> None:
    shares = cluster_shares({"a": 40e9, "c": 40e9}, 20e9, classes={"a": GOLD})
    assert shares["a"].budget == pytest.approx(10e9)
    assert shares["a"].scaled and not shares["a"].class_bound  # the cluster's cap binds


def test_idle_policies_count_toward_no_cap_and_are_told_what_they_would_get() -> None:
    shares = cluster_shares({"a": 40e9, "idle": 40e9, "c": 100e9}, 100e9,
                            counted={"a", "c"}, classes={"a": GOLD, "idle": GOLD})
    assert shares["a"].budget == pytest.approx(30e9)  # the class's whole cap
    assert shares["c"].budget == pytest.approx(70e9)
    assert shares["idle"].budget == pytest.approx(15e9)  # once it runs: half the class's
    assert shares["idle"].class_bound and not shares["idle"].counted


def test_the_status_reason_comes_from_the_sizing_under_the_class_cap() -> None:
    ten = SizingInput(checkpoint_bytes=900e9, interval_s=900, overlap=0.1)  # 10 GB/s
    joint = joint_sizing({"a": ten, "b": ten}, None, classes={"a": ClassCap("gold", 4e9)})
    sized, share = joint["a"]
    assert sized.allowed_bandwidth == pytest.approx(4e9) and sized.bandwidth_constrained
    assert share.class_bound
    assert not joint["b"][0].bandwidth_constrained


WANTS = st.floats(1e6, 1e12)


@st.composite
def splits(draw: st.DrawFn) -> tuple[dict[int, float], dict[int, int], set[int],
                                     dict[int, ClassCap], float | None]:
    n = draw(st.integers(1, 12))
    wanted = {i: draw(WANTS) for i in range(n)}
    weights = {i: draw(st.integers(1, 20)) for i in range(n)}
    counted = {i for i in range(n) if draw(st.booleans())}
    caps = {name: draw(WANTS) for name in ("gold", "silver")}
    classes = {i: ClassCap(name, caps[name]) for i in range(n)
               if (name := draw(st.sampled_from(["gold", "silver", None]))) is not None}
    cluster = draw(st.none() | st.floats(1e7, 1e13))
    return wanted, weights, counted, classes, cluster


def _full(total: float, cap: float) -> bool:
    return total >= cap * (1 - 1e-9)


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=300)
@given(splits())
def test_caps_hold_and_the_split_is_work_conserving(
        split: tuple[dict[int, float], dict[int, int], set[int], dict[int, ClassCap],
                     float | None]) -> None:
    wanted, weights, counted, classes, cluster = split
    shares = cluster_shares(wanted, cluster, counted, weights, classes)
    got = {k: shares[k].budget for k in counted}
    for k, budget in got.items():
        assert 0 <= budget <= wanted[k] * (1 + 1e-12)  # never above its demand
    total = math.fsum(got.values())
    if cluster is not None:
        assert total <= cluster * (1 + 1e-9)
    by_class: dict[str, float] = {}
    for k in counted & set(classes):
        by_class[classes[k].name] = by_class.get(classes[k].name, 0.0) + got[k]
    for k in counted & set(classes):
        assert by_class[classes[k].name] <= classes[k].cap * (1 + 1e-9)
    for k, budget in got.items():
        if budget < wanted[k] * (1 - 1e-9):
            # Cut: the cluster cap is full, or its own class's cap is.
            class_full = k in classes and _full(by_class[classes[k].name], classes[k].cap)
            assert (cluster is not None and _full(total, cluster)) or class_full
            # Its status blames its class only where the class's cap is full.
            assert class_full or not shares[k].class_bound


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None, max_examples=200)
@given(splits())
def test_idle_policies_take_nothing_and_are_told_exactly_what_they_would_get(
        split: tuple[dict[int, float], dict[int, int], set[int], dict[int, ClassCap],
                     float | None]) -> None:
    wanted, weights, counted, classes, cluster = split
    shares = cluster_shares(wanted, cluster, counted, weights, classes)
    alone = cluster_shares({k: wanted[k] for k in counted}, cluster, None, weights, classes)
    for k in counted:
        assert shares[k].budget == pytest.approx(alone[k].budget, rel=1e-9)
    for k in set(wanted) - counted:
        joined = cluster_shares(wanted, cluster, counted | {k}, weights, classes)
        assert shares[k].budget == pytest.approx(joined[k].budget, rel=1e-9)
