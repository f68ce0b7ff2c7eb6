"""The pure decision on a policy's node data (csi/collection.py): deleted
only after its owner has been seen deleted at two scans at least the grace
apart with no longer gap between sightings, never while published, never
under Retain; an odd answer neither starts, advances nor stops the clock,
a present owner stops it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.csi.collection import (
    DELETE,
    RETAIN,
    Decision,
    DeletedClock,
    Reclaim,
    Sighting,
    Verdict,
    decide,
    sighting,
)

UID = "11111111-1111-4111-8111-111111111111"
OTHER_UID = "22222222-2222-4222-8222-222222222222"
SCAN = 1.0  # the scan interval (s)
HOUR = Reclaim(DELETE, 3600.0)


def run(since: float, last: float | None = None) -> DeletedClock:
    return DeletedClock(since, since if last is None else last)


def test_the_answer_for_the_markers_name_is_a_sighting() -> None:
    assert sighting(UID, UID) is Sighting.PRESENT
    assert sighting(UID, None) is Sighting.DELETED  # 404
    # Deleted and created again under the same name: not this directory's owner.
    assert sighting(UID, OTHER_UID) is Sighting.DELETED


def test_a_first_deleted_sighting_only_starts_the_clock() -> None:
    assert decide(Sighting.DELETED, None, False, 1000.0, HOUR, SCAN) == \
        Decision(Verdict.PENDING, run(1000.0))
    # However short the grace: one answer never deletes anything.
    assert decide(Sighting.DELETED, None, False, 1000.0, Reclaim(DELETE, 0.001), SCAN).verdict \
        is Verdict.PENDING


def test_deleted_once_seen_deleted_over_the_whole_grace() -> None:
    assert decide(Sighting.DELETED, run(1000.0, 4000.0), False, 1000.0 + 3599, HOUR, SCAN) == \
        Decision(Verdict.PENDING, run(1000.0, 4599.0))
    assert decide(Sighting.DELETED, run(1000.0, 4000.0), False, 1000.0 + 3600, HOUR, SCAN) == \
        Decision(Verdict.DELETE, run(1000.0, 4600.0))
    # Sightings exactly a grace apart still join up.
    assert decide(Sighting.DELETED, run(1000.0), False, 1000.0 + 3600, HOUR, SCAN).verdict \
        is Verdict.DELETE


def test_a_gap_longer_than_the_grace_between_sightings_starts_the_clock_again() -> None:
    # Seen deleted at 1000, then nothing definite (errors, odd 404s) for longer
    # than the grace: the owner may have been back meanwhile.
    assert decide(Sighting.UNKNOWN, run(1000.0), False, 3000.0, HOUR, SCAN) == \
        Decision(Verdict.PENDING, run(1000.0))
    assert decide(Sighting.DELETED, run(1000.0), False, 1000.0 + 3601, HOUR, SCAN) == \
        Decision(Verdict.PENDING, run(4601.0))
    assert decide(Sighting.DELETED, run(1000.0, 2000.0), False, 5601.0, HOUR, SCAN) == \
        Decision(Verdict.PENDING, run(5601.0))


def test_a_published_volume_holds_the_deletion() -> None:
    assert decide(Sighting.DELETED, run(0.0, 10**6 - 1), True, 10**6, HOUR, SCAN) == \
        Decision(Verdict.PENDING, run(0.0, 10**6))


def test_retain_keeps_the_data_and_reports_it() -> None:
    retain = Reclaim(RETAIN, 1.0)
    assert decide(Sighting.DELETED, None, False, 5.0, retain, SCAN) == \
        Decision(Verdict.RETAINED, run(5.0))
    assert decide(Sighting.DELETED, run(5.0, 9.0), False, 9.5, retain, SCAN) == \
        Decision(Verdict.RETAINED, run(5.0, 9.5))


def test_a_present_owner_stops_the_clock() -> None:
    assert decide(Sighting.PRESENT, run(1000.0), False, 10**9, HOUR, SCAN) == \
        Decision(Verdict.LIVE, None)
    assert decide(Sighting.PRESENT, None, False, 10**9, HOUR, SCAN) == Decision(Verdict.LIVE, None)


def test_an_unknown_answer_neither_starts_advances_nor_stops_the_clock() -> None:
    assert decide(Sighting.UNKNOWN, None, False, 10**9, HOUR, SCAN) == Decision(Verdict.LIVE, None)
    # Long past the grace, but the owner's fate is not known now: kept.
    assert decide(Sighting.UNKNOWN, run(0.0, 10.0), False, 10**9, HOUR, SCAN) == \
        Decision(Verdict.PENDING, run(0.0, 10.0))


def test_a_clock_that_went_back_deletes_nothing() -> None:
    assert decide(Sighting.DELETED, run(5000.0), False, 1000.0, HOUR, SCAN) == \
        Decision(Verdict.PENDING, run(1000.0))


def test_the_clock_read_after_a_restart_counts_the_grace_from_the_first_sighting() -> None:
    # A restarted driver reads the clock from disk: the grace does not start again.
    first = decide(Sighting.DELETED, None, False, 100.0, HOUR, SCAN)
    middle = decide(Sighting.DELETED, first.clock, False, 100.0 + 1800, HOUR, SCAN)
    after_restart = decide(Sighting.DELETED, middle.clock, False, 100.0 + 3600, HOUR, SCAN)
    assert after_restart.verdict is Verdict.DELETE


def deletion_is_earned(scans: list[tuple[Sighting, float]], grace: float) -> bool:
    """The rule stated plainly, over the whole history (the last scan is
    now): some DELETED sighting at least the grace ago starts a run of
    DELETED sightings, none of them more than the grace apart (or going
    back in time), with no PRESENT answer anywhere in it, ending in a
    DELETED sighting now."""
    if not scans or scans[-1][0] is not Sighting.DELETED:
        return False
    now = scans[-1][1]
    later = now  # the time of the next DELETED sighting of the run
    for seen, at in reversed(scans[:-1]):
        if seen is Sighting.PRESENT:
            return False
        if seen is Sighting.DELETED:
            if not 0 <= later - at <= grace:
                return False
            if now - at >= grace:
                return True
            later = at
    return False


@given(st.lists(st.tuples(st.sampled_from(list(Sighting)), st.floats(0, 7200)), max_size=12),
       st.booleans(), st.sampled_from([DELETE, RETAIN]))
def test_deleted_exactly_when_seen_deleted_over_the_whole_grace(
        scans: list[tuple[Sighting, float]], published: bool, policy: str) -> None:
    """Over any run of scans (times never going back): a deletion happens on
    the first scan where the rule holds, unpublished, under Delete, and on
    no other."""
    reclaim = Reclaim(policy, 3600.0)
    clock: DeletedClock | None = None
    now = 0.0
    history: list[tuple[Sighting, float]] = []
    for seen, step in scans:
        now += step
        history.append((seen, now))
        decision = decide(seen, clock, published, now, reclaim, SCAN)
        earned = deletion_is_earned(history, reclaim.grace_s)
        assert (decision.verdict is Verdict.DELETE) == \
            (earned and not published and policy == DELETE), history
        if decision.verdict is Verdict.DELETE:
            return
        clock = decision.clock


@pytest.mark.parametrize("seen", list(Sighting))
def test_retain_never_deletes(seen: Sighting) -> None:
    assert decide(seen, run(0.0, 10**9 - 1), False, 10**9, Reclaim(RETAIN, 1.0), SCAN).verdict \
        is not Verdict.DELETE


def test_a_grace_shorter_than_the_scan_interval_still_runs_out() -> None:
    """Sightings a scan interval apart are no silence, however short the
    grace: the silence window is at least a few intervals."""
    fast = Reclaim(DELETE, 30.0)
    first = decide(Sighting.DELETED, None, False, 1000.0, fast, 60.0)
    second = decide(Sighting.DELETED, first.clock, False, 1060.0, fast, 60.0)
    assert second == Decision(Verdict.DELETE, run(1000.0, 1060.0))
    # A silence longer than the window still starts the run again.
    assert decide(Sighting.DELETED, first.clock, False, 1000.0 + 181, fast, 60.0) == \
        Decision(Verdict.PENDING, run(1181.0))
