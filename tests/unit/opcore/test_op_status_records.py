"""operator/policy/status.py and operator/records/aggregate.py (the operator's side of the
records)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ckptdrain import sizing
from ckptdrain.contract import record as fmt
from ckptdrain.contract.api import timestamp
from ckptdrain.contract.progress import Claim
from ckptdrain.operator.policy import status
from ckptdrain.operator.records import aggregate as records

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def sized(**kw: Any) -> sizing.Sizing:
    return sizing.compute(sizing.SizingInput(parameters=405e9, interval_s=900, **kw))


def cond(st: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in st["conditions"] if c["type"] == kind)


def test_ready_policy_status() -> None:
    st = status.for_sizing(sized(), 3, NOW)
    assert st["phase"] == "Ready" and st["requiredBandwidth"] == "63.0 GB/s"
    assert st["requiredBandwidthBytes"] == 63_000_000_000
    assert cond(st, "Ready")["status"] == "True"
    assert cond(st, "BandwidthConstrained")["status"] == "False"
    assert all(c["observedGeneration"] == 3 for c in st["conditions"])


def test_constrained_policy_reports_effective_overlap() -> None:
    st = status.for_sizing(sized(policy_cap=21e9), 1, NOW)
    c = cond(st, "BandwidthConstrained")
    assert st["phase"] == "Constrained" and c["status"] == "True" and c["reason"] == "PolicyCap"
    assert st["effectiveOverlap"] == "30%" and "effective overlap 30%" in c["message"]


def test_invalid_policy_status_names_the_field() -> None:
    st = status.for_invalid("spec.overlap: expected …", 2, NOW)
    assert st["phase"] == "Invalid"
    assert cond(st, "Ready")["reason"] == "InvalidSpec"
    assert cond(st, "Degraded")["status"] == "True"


def test_transition_time_moves_only_on_flip() -> None:
    first = status.for_sizing(sized(), 1, NOW)
    later = status.for_sizing(sized(), 2, NOW + timedelta(hours=1), first["conditions"])
    assert cond(later, "Ready")["lastTransitionTime"] == cond(first, "Ready")["lastTransitionTime"]
    flipped = status.for_invalid("x", 3, NOW + timedelta(hours=2), later["conditions"])
    assert cond(flipped, "Ready")["lastTransitionTime"] == "2026-01-02T05:04:05Z"


def record(step: int, claims: dict[str, str], writers: int = 2,
           state: str | None = None) -> dict[str, Any]:
    """A record as agents from before the progress annotation left it: one
    claim per writer in status.writers, keyed by the writer's rank."""
    r = fmt.build_record("ns", "pol", step, writers)
    r["status"] = {"writers": {w: fmt.writer_patch(w, s, 100, ["local", "global"]
                                                       if s == "Global" else ["local"], NOW)
                               ["status"]["writers"][w] for w, s in claims.items()}}
    if state:
        r["status"]["state"] = state
    return r


@pytest.mark.parametrize(("claims", "state"), [
    ({}, "Capturing"),
    ({"0": "Local"}, "Capturing"),
    ({"0": "Local", "1": "Local"}, "Local"),
    ({"0": "Global", "1": "Local"}, "Draining"),
    ({"0": "Global", "1": "Global"}, "Global"),
    ({"0": "Global", "1": "Failed"}, "Failed"),
])
def test_aggregate_state(claims: dict[str, str], state: str) -> None:
    assert records.summarize(record(1, claims)).state == state


def test_global_is_complete_only_with_every_writer() -> None:
    half = records.summarize(record(1, {"0": "Global"}))
    assert not half.complete and half.tiers == "local" and half.writers == "1/2"
    full = records.aggregate_patch(record(1, {"0": "Global", "1": "Global"}), NOW)
    assert full["state"] == "Global" and full["tiers"] == "global,local"
    assert full["completionTime"] == "2026-01-02T03:04:05Z" and full["sizeBytes"] == 200


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


def test_young_daly_and_recommended_interval_when_known() -> None:
    s = sizing.compute(sizing.SizingInput(parameters=405e9, mtti_s=9000, local_write_s=30))
    fields = status.sizing_fields(s)
    assert fields["recommendedInterval"] == "15m"  # a tenth of 150 m
    assert fields["youngDalyInterval"] == "12m15s"  # sqrt(2 × 30 s × 9000 s) = 734.8 s


def test_a_drain_stalls_after_two_missed_intervals() -> None:
    since = NOW - timedelta(hours=5)
    last = NOW - timedelta(minutes=31)
    assert status.drain_stall(last, since, 900, 90, 4, NOW) is None  # 31 m < 2×15 m + 90 s
    stall = status.drain_stall(NOW - timedelta(minutes=40), since, 900, 90, 4, NOW)
    assert stall is not None and "40m" in stall and "15m" in stall
    assert status.drain_stall(None, NOW - timedelta(minutes=10), 900, 90, 4, NOW) is None
    assert "no checkpoint" in (status.drain_stall(None, since, 900, 90, 4, NOW) or "")
    assert status.drain_stall(None, since, 900, 90, 0, NOW) is None  # nothing runs


def test_stall_flips_degraded_and_phase_and_back() -> None:
    ready = status.for_sizing(sized(), 1, NOW)
    stalled = status.with_stall(ready, "no checkpoint …", 1, NOW)
    assert stalled is not None and stalled["phase"] == "Stalled"
    assert cond(stalled, "Degraded")["reason"] == "DrainStalled"
    assert status.with_stall({**ready, **stalled}, "no checkpoint …", 1, NOW) is None
    healed = status.with_stall({**ready, **stalled}, None, 1, NOW)
    assert healed is not None and healed["phase"] == "Ready"
    assert cond(healed, "Degraded")["status"] == "False"
    assert status.with_stall(ready, None, 1, NOW) is None


def test_owner_patch_adds_the_policy_once() -> None:
    rec = fmt.build_record("ns", "pol", 1, 1)
    patch = records.owner_patch(rec, "uid-1")
    assert patch == {"metadata": {"ownerReferences": [{
        "apiVersion": "ckptdrain.io/v1alpha1", "kind": "CheckpointPolicy", "name": "pol",
        "uid": "uid-1"}]}}
    assert records.owner_patch(fmt.build_record("ns", "pol", 1, 1, "uid-1"), "uid-1") is None
    assert records.owner_patch(rec, None) is None


def test_two_live_pods_on_one_writer_are_named_in_the_condition() -> None:
    ok = status.writers_check([("a", "0", 2), ("b", "1", 2)], 2)
    assert ok == (True, "Consistent", "2 live pod(s), each its own writer")
    shared = status.writers_check([("a", "1", None), ("b", "0", None), ("c", "1", None)], 2)
    assert shared[:2] == (False, "DuplicateWriter")
    assert "writer 1 is held by pods a, c" in shared[2]
    off = status.writers_check([("a", "0", 4), ("b", "1", 4)], 2)
    assert off[:2] == (False, "WritersMismatch")
    assert "spec.writers is 2 but pod a's workload has 4 pods that write" in off[2]


def test_writers_condition_is_written_once_and_kept_by_sizing() -> None:
    base = status.for_sizing(sized(), 1, NOW)
    check = status.writers_check([("a", "0", None), ("b", "0", None)], 2)
    change = status.with_writers(base, check, 1, NOW)
    assert change is not None
    after = {**base, **change}
    assert cond(after, "WritersConsistent")["reason"] == "DuplicateWriter"
    assert status.with_writers(after, check, 1, NOW) is None  # unchanged: no write
    # Re-sizing rewrites its own four conditions and keeps this one.
    resized = status.for_sizing(sized(), 2, NOW, after["conditions"])
    assert cond(resized, "WritersConsistent")["status"] == "False"
    assert len(resized["conditions"]) == 5
    # Nothing sized yet: nothing to attach the condition to.
    assert status.with_writers({}, check, 1, NOW) is None


def test_a_writer_retrying_a_store_that_does_not_answer_is_not_a_failed_checkpoint() -> None:
    from ckptdrain.operator.records.aggregate import summarize

    record = {"spec": {"writers": 2}, "status": {"writers": {
        "0": {"state": "Global", "bytes": 5, "tiers": ["global", "local"]},
        "1": {"state": "Retrying", "bytes": 5, "tiers": ["local"],
              "message": "drain: endpoint did not answer; retrying in 4s"}}}}
    s = summarize(record)
    assert (s.state, s.complete, s.tiers) == ("Retrying", False, "local")
    record["status"]["writers"]["1"]["state"] = "Failed"
    assert summarize(record).state == "Failed"


# -- fold: the writers' progress (rank -> claim) folded into the record -------


def claim(state: str, size: int = 100, **kw: Any) -> Claim:
    tiers = {"Capturing": ()}.get(state, ("global", "local") if state == "Global"
                                  else ("local",))
    return Claim(state=state, bytes=size, tiers=kw.pop("tiers", tiers),
                 at="2026-01-02T03:04:05Z", **kw)


def applied(rec: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """The record after the operator's merge patch of its status (a null
    removes the key: that is how a state's rank range goes away)."""
    status = dict(rec.get("status") or {})
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(status.get(key), dict):
            merged = {**status[key], **value}
            status[key] = {k: v for k, v in merged.items() if v is not None}
        elif isinstance(value, dict):
            status[key] = {k: v for k, v in value.items() if v is not None}
        elif value is None:
            status.pop(key, None)
        else:
            status[key] = value
    return {**rec, "status": status}


def folded(rec: dict[str, Any], claims: dict[int, Claim],
           now: datetime = NOW) -> dict[str, Any]:
    """Fold, apply, and check that folding the same claims again changes
    nothing (the operator's own write comes back to it as an event)."""
    after = applied(rec, records.fold(rec, claims, now))
    assert records.fold(after, claims, now) == {}, "a second fold of the same claims wrote"
    return after


def new_record(step: int = 5, writers: int = 2) -> dict[str, Any]:
    return fmt.build_record("ns", "pol", step, writers)


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


def ranked(step: int, states: dict[int, str], writers: int = 2, expired: bool = False,
           made: datetime = NOW - timedelta(hours=2)) -> dict[str, Any]:
    rec = folded(new_record(step, writers), {r: claim(s) for r, s in states.items()})
    rec["metadata"]["creationTimestamp"] = timestamp(made)
    if expired:
        rec["status"]["state"] = "Expired"
    return rec


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
