"""The pure decision on a policy's node data (csi/collection.py): deleted
only after its owner has been seen deleted at two scans at least the grace
apart, never while published, never under Retain; an odd answer neither
starts nor stops the clock, a present owner stops it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.csi.collection import (
    DELETE,
    RETAIN,
    Decision,
    Reclaim,
    Sighting,
    Verdict,
    decide,
    sighting,
)

UID = "11111111-1111-4111-8111-111111111111"
OTHER_UID = "22222222-2222-4222-8222-222222222222"
HOUR = Reclaim(DELETE, 3600.0)


def test_the_answer_for_the_markers_name_is_a_sighting() -> None:
    assert sighting(UID, UID) is Sighting.PRESENT
    assert sighting(UID, None) is Sighting.DELETED  # 404
    # Deleted and created again under the same name: not this directory's owner.
    assert sighting(UID, OTHER_UID) is Sighting.DELETED


def test_a_first_deleted_sighting_only_starts_the_clock() -> None:
    assert decide(Sighting.DELETED, None, False, 1000.0, HOUR) == \
        Decision(Verdict.PENDING, 1000.0)
    # However short the grace: one answer never deletes anything.
    assert decide(Sighting.DELETED, None, False, 1000.0, Reclaim(DELETE, 0.001)).verdict \
        is Verdict.PENDING


def test_deleted_once_the_grace_has_passed_since_the_first_sighting() -> None:
    assert decide(Sighting.DELETED, 1000.0, False, 1000.0 + 3599, HOUR) == \
        Decision(Verdict.PENDING, 1000.0)
    assert decide(Sighting.DELETED, 1000.0, False, 1000.0 + 3600, HOUR) == \
        Decision(Verdict.DELETE, 1000.0)


def test_a_published_volume_holds_the_deletion() -> None:
    assert decide(Sighting.DELETED, 0.0, True, 10**6, HOUR) == Decision(Verdict.PENDING, 0.0)


def test_retain_keeps_the_data_and_reports_it() -> None:
    retain = Reclaim(RETAIN, 1.0)
    assert decide(Sighting.DELETED, None, False, 5.0, retain) == Decision(Verdict.RETAINED, 5.0)
    assert decide(Sighting.DELETED, 5.0, False, 10**9, retain) == Decision(Verdict.RETAINED, 5.0)


def test_a_present_owner_stops_the_clock() -> None:
    assert decide(Sighting.PRESENT, 1000.0, False, 10**9, HOUR) == Decision(Verdict.LIVE, None)
    assert decide(Sighting.PRESENT, None, False, 10**9, HOUR) == Decision(Verdict.LIVE, None)


def test_an_unknown_answer_neither_starts_nor_stops_the_clock() -> None:
    assert decide(Sighting.UNKNOWN, None, False, 10**9, HOUR) == Decision(Verdict.LIVE, None)
    # Long past the grace, but the owner's fate is not known now: kept.
    assert decide(Sighting.UNKNOWN, 0.0, False, 10**9, HOUR) == Decision(Verdict.PENDING, 0.0)


def test_a_clock_that_went_back_deletes_nothing() -> None:
    assert decide(Sighting.DELETED, 5000.0, False, 1000.0, HOUR).verdict is Verdict.PENDING


def test_the_clock_read_after_a_restart_counts_the_grace_from_the_first_sighting() -> None:
    # A restarted driver reads the time from disk: the grace does not start again.
    first = decide(Sighting.DELETED, None, False, 100.0, HOUR)
    after_restart = decide(Sighting.DELETED, first.deleted_since, False, 100.0 + 3600, HOUR)
    assert after_restart.verdict is Verdict.DELETE


@given(st.lists(st.tuples(st.sampled_from(list(Sighting)), st.floats(0, 7200)), max_size=12),
       st.booleans(), st.sampled_from([DELETE, RETAIN]))
def test_nothing_is_deleted_unless_seen_deleted_now_and_a_grace_earlier(
        scans: list[tuple[Sighting, float]], published: bool, policy: str) -> None:
    """Over any run of scans: a deletion happens only on a DELETED answer,
    unpublished, under Delete, at least the grace after a DELETED answer
    with no PRESENT one in between."""
    reclaim = Reclaim(policy, 3600.0)
    since: float | None = None
    now = 0.0
    first_deleted: float | None = None
    for seen, step in scans:
        now += step
        if seen is Sighting.PRESENT:
            first_deleted = None
        elif seen is Sighting.DELETED and first_deleted is None:
            first_deleted = now
        decision = decide(seen, since, published, now, reclaim)
        if decision.verdict is Verdict.DELETE:
            assert seen is Sighting.DELETED and not published and policy == DELETE
            assert first_deleted is not None and now - first_deleted >= 3600.0
            return
        since = decision.deleted_since


@pytest.mark.parametrize("seen", list(Sighting))
def test_retain_never_deletes(seen: Sighting) -> None:
    assert decide(seen, 0.0, False, 10**9, Reclaim(RETAIN, 1.0)).verdict is not Verdict.DELETE
