"""operator/records/aggregate.py: which records retention expires (never the
newest complete one), which may be made, and the newest steps restore may take."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from tests.support.record_builders import NOW, claim, folded, new_record, record

from ckptdrain.contract.api import timestamp
from ckptdrain.contract.progress import Claim
from ckptdrain.operator.records import aggregate as records


def ranked(step: int, states: dict[int, str], writers: int = 2, expired: bool = False,
           made: datetime = NOW - timedelta(hours=2)) -> dict[str, Any]:
    rec = folded(new_record(step, writers), {r: claim(s) for r, s in states.items()})
    rec["metadata"]["creationTimestamp"] = timestamp(made)
    if expired:
        rec["status"]["state"] = "Expired"
    return rec


def test_retention_keeps_newest_complete() -> None:
    recs = [record(s, {"0": "Global", "1": "Global"}) for s in (10, 20, 30, 40)]
    recs.append(record(50, {"0": "Local"}))
    assert records.to_expire(recs, keep=2) == ["pol-s20", "pol-s10"]
    assert records.to_expire(recs[:1], keep=0) == []  # never the newest complete


def test_latest_steps_ignore_expired() -> None:
    recs = [record(10, {"0": "Global", "1": "Global"}, state="Expired"),
            record(20, {"0": "Global", "1": "Global"}),
            record(30, {"0": "Local", "1": "Local"})]
    recs[1]["status"]["completionTime"] = "2026-01-02T03:04:05Z"
    assert records.latest_steps(recs) == (30, 20, "2026-01-02T03:04:05Z")


def test_retention_expires_unfinished_records_a_newer_complete_one_supersedes() -> None:
    recs = [ranked(10, {0: "Global", 1: "Global"}),
            ranked(20, {0: "Failed", 1: "Global"}),
            ranked(30, {0: "Local"}),
            ranked(35, {0: "Global", 1: "Global"}, expired=True),
            ranked(40, {0: "Global", 1: "Global"}),
            ranked(50, {0: "Local", 1: "Capturing"}),
            ranked(60, {0: "Failed"})]
    # Both complete ones kept; the unfinished older than step 40 go, newest
    # first; newer ones stay (one may still become the recovery point).
    assert records.to_expire(recs, keep=2, now=NOW) == ["pol-s30", "pol-s20"]
    assert records.to_expire(recs, keep=1, now=NOW) == ["pol-s10", "pol-s30", "pol-s20"]
    assert records.to_expire(recs, keep=0, now=NOW) == ["pol-s10", "pol-s30", "pol-s20"]
    # Without the time, only complete records beyond `keep`.
    assert records.to_expire(recs, keep=1) == ["pol-s10"]


def test_a_superseded_record_gets_time_for_its_writers_to_fold_in() -> None:
    grace = records.SUPERSEDED_GRACE_S
    young = ranked(30, {0: "Global", 1: "Local"}, made=NOW - timedelta(seconds=grace - 1))
    old = ranked(20, {0: "Local"}, made=NOW - timedelta(seconds=grace))
    recs = [young, old, ranked(40, {0: "Global", 1: "Global"}, made=NOW)]
    assert records.to_expire(recs, keep=5, now=NOW) == ["pol-s20"]
    assert records.to_expire(recs, keep=5, now=NOW + timedelta(seconds=1)) == [
        "pol-s30", "pol-s20"]


def test_retention_never_expires_the_newest_complete_or_anything_without_one() -> None:
    only = [ranked(10, {0: "Global", 1: "Global"})]
    assert records.to_expire(only, keep=0, now=NOW) == []
    unfinished = [ranked(10, {0: "Failed"}), ranked(20, {0: "Local", 1: "Local"}),
                  ranked(30, {0: "Global"})]
    assert records.to_expire(unfinished, keep=0, now=NOW) == []


def test_records_are_made_above_the_newest_settled_step_or_for_a_fresh_start() -> None:
    said = {0: claim("Global")}  # said at 2026-01-02T03:04:05Z
    assert records.may_make(5, said, [])
    settled = ranked(20, {0: "Global", 1: "Global"})  # completed at NOW
    assert records.may_make(30, said, [settled])
    # Below it: a step retention removed, which writers still name.
    old_word = {0: Claim(state="Global", bytes=1, at=timestamp(NOW - timedelta(minutes=1)))}
    assert not records.may_make(10, old_word, [settled])
    assert not records.may_make(20, {0: Claim(state="Global")}, [settled])  # no time said
    # A fresh start from step 0 under the same policy: said after it settled.
    new_word = {0: Claim(state="Local", bytes=1, at=timestamp(NOW + timedelta(minutes=1)))}
    assert records.may_make(10, new_word, [settled])
    # An unfinished record does not settle anything.
    assert records.may_make(10, old_word, [ranked(30, {0: "Local", 1: "Local"})])


def test_the_local_recovery_point_is_the_newest_step_every_writer_holds_locally() -> None:
    # What restore agrees on when every node is intact: a step counts only
    # once every writer has it on its node (one writer still capturing step
    # 40 while another drains it does not make 40 restorable), whatever its
    # drain does meanwhile.
    recs = [record(20, {"0": "Global", "1": "Global"}),
            record(30, {"0": "Retrying", "1": "Local"}),
            record(40, {"0": "Draining", "1": "Capturing"}),
            record(50, {"0": "Local"})]
    assert records.latest_steps(recs)[:2] == (30, 20)
    # A writer whose shard failed (a corrupt copy, a capture refused) holds
    # nothing restore would take.
    recs[1] = record(30, {"0": "Failed", "1": "Local"})
    assert records.latest_steps(recs)[:2] == (20, 20)
