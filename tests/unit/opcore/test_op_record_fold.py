"""operator/records/aggregate.py: the writers' progress (rank -> claim) folded
into the record, idempotently: rank ranges per state, bytes counted once,
failures named, legacy claims migrated."""

from __future__ import annotations

from datetime import timedelta

from tests.support.record_builders import NOW, claim, folded, new_record, record

from ckptdrain.contract import record as fmt
from ckptdrain.contract.api import timestamp
from ckptdrain.operator.records import aggregate as records


def test_fold_keeps_rank_ranges_per_state() -> None:
    rec = folded(new_record(writers=8), {
        0: claim("Global"), 1: claim("Global"), 2: claim("Global"), 3: claim("Local"),
        5: claim("Local"), 4: claim("Capturing", 0), 7: claim("Draining")})
    st = rec["status"]
    assert st["ranks"] == {"Global": "0-2", "Local": "3,5", "Capturing": "4", "Draining": "7"}
    assert st["writersReady"] == "7/8" and st["state"] == "Draining"
    assert st["sizeBytes"] == 600 and st["tiers"] == "local"  # global only when complete
    assert "completionTime" not in st
    s = records.summarize(rec)
    assert (s.state, s.size_bytes, s.writers, s.complete) == ("Draining", 600, "7/8", False)


def test_a_state_a_writer_left_loses_its_range() -> None:
    rec = folded(new_record(), {0: claim("Local"), 1: claim("Local")})
    assert rec["status"]["ranks"] == {"Local": "0-1"} and rec["status"]["state"] == "Local"
    change = records.fold(rec, {0: claim("Draining"), 1: claim("Draining")}, NOW)
    assert change["ranks"]["Local"] is None and change["ranks"]["Draining"] == "0-1"


def test_a_writers_bytes_count_once_however_often_it_is_folded() -> None:
    rec = new_record()
    for state in ("Capturing", "Local", "Draining", "Retrying", "Draining", "Global"):
        rec = folded(rec, {0: claim(state, 0 if state == "Capturing" else 100)})
        assert rec["status"]["sizeBytes"] == (0 if state == "Capturing" else 100), state
    rec = folded(rec, {0: claim("Global"), 1: claim("Local", 50)})
    assert rec["status"]["sizeBytes"] == 150
    rec = folded(rec, {0: claim("Global"), 1: claim("Global", 50)})
    assert rec["status"]["sizeBytes"] == 150


def test_a_writer_whose_pod_is_gone_still_counts() -> None:
    rec = folded(new_record(), {0: claim("Global"), 1: claim("Local", 50)})
    # Writer 0's pod is gone (its node too): the record keeps what it said.
    rec = folded(rec, {1: claim("Global", 50)})
    st = rec["status"]
    assert st["ranks"] == {"Global": "0-1"} and st["state"] == "Global"
    assert st["sizeBytes"] == 150 and st["tiers"] == "global,local"
    assert records.fold(rec, {}, NOW) == {}  # nobody says anything: nothing changes


def test_a_writer_that_starts_a_step_over_makes_it_incomplete_until_it_commits_again() -> None:
    # A job restored from an older step checkpoints this step again: the
    # writers that committed it before start over, and the record must not
    # show the old commits mixed with the new ones as complete.
    rec = folded(new_record(writers=2), {0: claim("Global"), 1: claim("Global")})
    assert rec["status"]["state"] == "Global" and rec["status"]["completionTime"]
    rec = folded(rec, {0: claim("Capturing")})
    assert rec["status"]["state"] == "Draining"
    assert rec["status"]["ranks"] == {"Capturing": "0", "Global": "1"}
    assert "completionTime" not in rec["status"]
    assert rec["status"]["sizeBytes"] == 200  # the shard is not counted twice
    rec = folded(rec, {0: claim("Global")}, NOW + timedelta(minutes=5))
    assert rec["status"]["state"] == "Global"
    assert rec["status"]["completionTime"] == timestamp(NOW + timedelta(minutes=5))


def test_a_writer_that_fails_after_global_is_listed_once_and_cleared_when_it_commits() -> None:
    rec = folded(new_record(), {0: claim("Global"), 1: claim("Local")})
    late = {0: claim("Failed", message="verify: manifest mismatch"), 1: claim("Local")}
    rec = folded(rec, late)
    assert rec["status"]["ranks"] == {"Failed": "0", "Local": "1"}
    assert rec["status"]["failures"] == [{"writer": 0, "message": "verify: manifest mismatch"}]
    rec = folded(rec, {0: claim("Global"), 1: claim("Global")})
    assert rec["status"]["state"] == "Global" and "failures" not in rec["status"]


def test_ranks_beyond_the_records_writers_never_count() -> None:
    rec = folded(new_record(writers=2), {5: claim("Global"), 7: claim("Global")})
    assert rec["status"]["state"] == "Capturing" and rec["status"]["writersReady"] == "0/2"
    legacy = record(5, {"0": "Global", "9": "Global"})
    assert records.summarize(legacy).writers == "1/2"


def test_a_writer_first_seen_without_bytes_is_sized_when_it_reports_them() -> None:
    rec = folded(new_record(writers=1), {0: claim("Retrying", size=0)})
    assert rec["status"]["sizeBytes"] == 0
    rec = folded(rec, {0: claim("Global", size=300)})
    assert rec["status"]["sizeBytes"] == 300 and rec["status"]["sized"] == "0"


def test_failures_name_the_first_five_writers_that_failed() -> None:
    claims = {r: claim("Failed", message=f"drain: denied on {r}") for r in range(8)}
    claims[8] = claim("Failed")  # no reason given: counted, not listed
    rec = folded(new_record(writers=9), claims)
    st = rec["status"]
    assert st["state"] == "Failed" and st["ranks"] == {"Failed": "0-8"}
    assert len(st["failures"]) == records.MAX_FAILURES == 5
    assert {f["writer"] for f in st["failures"]} <= set(range(8))
    assert all(f["message"] == f"drain: denied on {f['writer']}" for f in st["failures"])
    # One more writer failing later does not push one out either.
    rec = folded(rec, {9: claim("Failed", message="late")})
    assert rec["status"]["failures"] == st["failures"]


def test_a_writer_failing_once_is_listed_once() -> None:
    rec = folded(new_record(), {0: claim("Failed", message="denied"), 1: claim("Local")})
    rec = folded(rec, {0: claim("Failed", message="denied"), 1: claim("Draining")})
    assert rec["status"]["failures"] == [{"writer": 0, "message": "denied"}]


def test_requests_are_summed_once_when_each_writer_reaches_global() -> None:
    rec = new_record()
    rec = folded(rec, {0: claim("Draining", requests={"put": 1})})  # not finished: not yet
    assert "requests" not in rec["status"]
    rec = folded(rec, {0: claim("Global", requests={"put": 3, "bytesUp": 100})})
    assert rec["status"]["requests"] == {"put": 3, "bytesUp": 100}
    rec = folded(rec, {0: claim("Global", requests={"put": 3, "bytesUp": 100}),
                       1: claim("Global", requests={"put": 2, "list": 1})})
    assert rec["status"]["requests"] == {"put": 5, "bytesUp": 100, "list": 1}
    rec = folded(rec, {1: claim("Global", requests={"put": 2, "list": 1})})
    assert rec["status"]["requests"] == {"put": 5, "bytesUp": 100, "list": 1}


def test_completion_time_is_set_once() -> None:
    rec = folded(new_record(), {0: claim("Global"), 1: claim("Local")})
    assert "completionTime" not in rec["status"]
    rec = folded(rec, {1: claim("Global")})
    assert rec["status"]["completionTime"] == "2026-01-02T03:04:05Z"
    later = NOW + timedelta(hours=1)
    # Something else changes later (the peer copy lands): the time stays.
    change = records.fold(rec, {1: claim("Global", tiers=("global", "local", "peer"))}, later)
    assert change == {"tiers": "global,local,peer"}


def test_legacy_claims_migrate_into_ranks() -> None:
    legacy = record(5, {"0": "Global", "1": "Local"})
    legacy["status"]["writers"]["1"]["requests"] = {"put": 9}
    before = records.summarize(legacy)
    rec = folded(legacy, {})
    st = rec["status"]
    assert st["ranks"] == {"Global": "0", "Local": "1"} and st["sizeBytes"] == 200
    after = records.summarize(rec)
    assert (after.state, after.size_bytes, after.tiers, after.writers, after.complete) == (
        before.state, before.size_bytes, before.tiers, before.writers, before.complete)
    # Writer 1, upgraded, now says Global on its pod: its bytes were counted
    # at migration, its requests are counted now, once.
    rec = folded(rec, {1: claim("Global", requests={"put": 2})})
    st = rec["status"]
    assert st["state"] == "Global" and st["sizeBytes"] == 200 and st["requests"] == {"put": 2}
    assert st["ranks"] == {"Global": "0-1"}


def test_a_legacy_claim_and_new_progress_fold_together() -> None:
    legacy = record(5, {"0": "Local"})  # writer 0's agent is not upgraded yet
    rec = folded(legacy, {1: claim("Global", 50)})
    st = rec["status"]
    assert st["ranks"] == {"Local": "0", "Global": "1"} and st["sizeBytes"] == 150
    # It goes on claiming in status.writers, after the record has its ranks.
    rec["status"]["writers"]["0"] = fmt.writer_patch(
        "0", "Global", 100, ["global", "local"], NOW)["status"]["writers"]["0"]
    rec = folded(rec, {1: claim("Global", 50)})
    st = rec["status"]
    assert st["state"] == "Global" and st["ranks"] == {"Global": "0-1"}
    assert st["sizeBytes"] == 150 and st["completionTime"] == "2026-01-02T03:04:05Z"


def test_summarize_reads_both_formats_alike() -> None:
    for states in ({"0": "Local"}, {"0": "Global", "1": "Local"},
                   {"0": "Global", "1": "Global"}, {"0": "Retrying", "1": "Global"}):
        legacy = record(5, states)
        ranked = folded(new_record(), {int(w): claim(s) for w, s in states.items()})
        a, b = records.summarize(legacy), records.summarize(ranked)
        assert (a.state, a.size_bytes, a.tiers, a.writers, a.complete) == (
            b.state, b.size_bytes, b.tiers, b.writers, b.complete), states
