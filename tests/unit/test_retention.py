"""Retention, every tier: global keeps the newest `keep` complete steps and never
touches newer ones; records expire the same way; the local tier keeps its recovery point."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.retention import complete_expired, global_expired, local_expired


def test_older_than_the_kept_ones_go_complete_or_not() -> None:
    assert global_expired(complete=[10, 20, 30, 40], present=[5, 10, 20, 30, 40, 50],
                          keep=2) == [5, 10, 20]


def test_nothing_goes_until_keep_steps_are_complete() -> None:
    assert global_expired(complete=[30], present=[10, 20, 30, 40], keep=2) == []


@pytest.mark.parametrize("keep", [0, -1, True])
def test_keep_must_be_positive(keep: int) -> None:
    with pytest.raises(ValueError, match="keep"):
        global_expired([1], [1], keep)


@given(st.sets(st.integers(0, 100)), st.sets(st.integers(0, 100)), st.integers(1, 5))
def test_never_the_newest_complete_nor_anything_newer_than_a_kept_step(
        complete: set[int], incomplete: set[int], keep: int) -> None:
    present = complete | incomplete
    gone = set(global_expired(complete, present, keep))
    assert gone <= present
    if complete:
        assert max(complete) not in gone
    kept = sorted(complete, reverse=True)[:keep]
    assert not gone & set(kept)
    assert all(step < min(kept) for step in gone)
    assert len(complete - gone) >= min(keep, len(complete))


# Local tier ----------------------------------------------------------------------
@pytest.mark.parametrize(("steps", "keep", "global_", "protected", "doomed"), [
    ([1, 2, 3, 4], 2, [1, 2, 3, 4], [], [1, 2]),  # plain keep-newest-K
    ([1, 2, 3], 1, [3], [1], [2]),  # protected (being drained) is never deleted
    ([5, 6, 7], 1, [], [], [5, 6]),
    # keep=0 (as a stress): the newest step not yet global still survives.
    ([1, 2, 3], 0, [1], [], [1, 2]),
    # ...but not when a newer step is already global: it is superseded.
    ([1, 2, 3], 0, [3], [], [1, 2, 3]),
])
def test_local_retention(steps: list[int], keep: int, global_: list[int], protected: list[int],
                        doomed: list[int]) -> None:
    assert local_expired(steps, keep, global_, protected) == doomed


def test_retention_keeps_newest_unglobal_behind_newer_local() -> None:
    # keep=1: 4 is newest; 3 is not global but 2 is, and 4 is newer and not global:
    # only the newest pending (4) is special, so 3 may go.
    assert local_expired([2, 3, 4], 1, [2], []) == [2, 3]
    # If the newest is global, older pending ones are superseded.
    assert local_expired([2, 3, 4], 1, [4], []) == [2, 3]


# Records ---------------------------------------------------------------------------
def test_records_keep_what_global_retention_keeps() -> None:
    assert complete_expired([10, 20, 30, 40], keep=2) == [20, 10]
    assert complete_expired([10], keep=0) == []  # never the newest complete
    assert complete_expired([], keep=3) == []


@given(st.sets(st.integers(0, 50), max_size=12), st.integers(1, 6))
def test_records_and_store_agree_on_which_complete_steps_stay(complete: set[int],
                                                               keep: int) -> None:
    gone = set(global_expired(complete, complete, keep))
    if len(complete) >= keep:
        assert gone == set(complete_expired(complete, keep))
