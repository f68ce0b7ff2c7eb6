"""operator/allocation.py: shares, budgets under a cluster cap, minimal rewrites."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptdrain.operator.allocation import (
    DrainingPod,
    changes,
    parse_annotation_number,
    policy_budgets,
    shares,
)


def drainers(pending: list[float | None], current: int | None = None) -> list[DrainingPod]:
    return [DrainingPod(f"p{i}", v, current) for i, v in enumerate(pending)]


def test_even_split_when_nothing_is_known() -> None:
    assert shares(63e9, drainers([None, None, None])) == {f"p{i}": 21_000_000_000
                                                         for i in range(3)}


def test_split_in_proportion_to_pending_bytes() -> None:
    got = shares(30e9, drainers([1e12, 2e12]))
    assert got == {"p0": 10_000_000_000, "p1": 20_000_000_000}


def test_per_drainer_cap() -> None:
    got = shares(30e9, drainers([1e12, 2e12]), per_drainer_cap=12e9)
    assert max(got.values()) <= 12e9


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.floats(1e6, 1e12), st.lists(st.one_of(st.none(), st.floats(0, 1e13)),
                                      min_size=1, max_size=50))
def test_shares_sum_to_the_budget_and_everyone_moves(budget: float,
                                                     pending: list[float | None]) -> None:
    got = shares(budget, drainers(pending))
    assert set(got) == {f"p{i}" for i in range(len(pending))}
    assert all(v >= 1 for v in got.values())
    assert sum(got.values()) == pytest.approx(budget, rel=1e-6, abs=len(pending) + 1)


def test_cluster_cap_scales_every_policy_alike() -> None:
    got = policy_budgets({"a": 60e9, "b": 20e9}, cluster_cap=40e9)
    assert got == {"a": pytest.approx(30e9), "b": pytest.approx(10e9)}
    assert policy_budgets({"a": 60e9}, None) == {"a": 60e9}
    assert policy_budgets({"a": 10e9}, 40e9) == {"a": 10e9}


def test_only_pods_whose_share_moved_are_rewritten() -> None:
    current = [DrainingPod("a", None, 100), DrainingPod("b", None, 100),
               DrainingPod("c", None, None), DrainingPod("d", None, 100)]
    got = changes(current, {"a": 101, "b": 150, "c": 100, "d": 99})
    assert got == {"b": 150, "c": 100, "d": 99}  # small rises wait; every cut is written


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.integers(1, 10**12), min_size=1, max_size=30),
       st.lists(st.integers(1, 10**12), min_size=1, max_size=30))
def test_after_changes_the_sum_never_exceeds_the_new_budget(
        before: list[int], after: list[int]) -> None:
    n = min(len(before), len(after))
    current = [DrainingPod(f"p{i}", None, before[i]) for i in range(n)]
    wanted = {f"p{i}": after[i] for i in range(n)}
    applied = {d.pod: d.current_share for d in current} | changes(current, wanted)
    assert sum(v or 0 for v in applied.values()) <= sum(wanted.values())


@pytest.mark.parametrize(("text", "value"), [
    ("123", 123.0), (" 5e9 ", 5e9), ("-1", None), ("x", None), (None, None), ("nan", None)])
def test_annotation_numbers(text: object, value: float | None) -> None:
    assert parse_annotation_number(text) == value
