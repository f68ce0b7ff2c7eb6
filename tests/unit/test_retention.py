"""Global retention keeps the newest `keep` complete steps and never touches newer ones."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.retention import global_expired


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
