"""A step done again after a restart: its record dates the run that holds it
now (operator/records/recapture.py, folded by records/aggregate.py), and the
recency a workload carries shows that time (operator/recency/document.py)."""

from __future__ import annotations

import re
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from ckptdrain.contract import record as fmt
from ckptdrain.contract.api import timestamp
from ckptdrain.contract.progress import Claim
from ckptdrain.operator.recency import document
from ckptdrain.operator.records import aggregate as records
from ckptdrain.operator.records import recapture

ROOT = Path(__file__).resolve().parents[3]

#: The first run captured step 500 at MADE; the job failed, restored step 400
#: and reached 500 again ten minutes later.
MADE = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
AGAIN = MADE + timedelta(minutes=10)


def claim(state: str, at: datetime) -> Claim:
    tiers = ("global", "local") if state == "Global" else ("local",)
    return Claim(state=state, bytes=100, tiers=tiers, at=timestamp(at))


def folded(rec: dict[str, Any], claims: dict[int, Claim], now: datetime) -> dict[str, Any]:
    """The record after the operator's fold (a null deletes a field), which a
    second fold of the same claims leaves alone."""
    change = records.fold(rec, claims, now)
    status = {k: v for k, v in {**(rec.get("status") or {}), **change}.items() if v is not None}
    after = {**rec, "status": status}
    assert records.fold(after, claims, now) == {}, "a second fold of the same claims wrote"
    return after


def committed(writers: int = 3) -> dict[str, Any]:
    """Step 500's record as the first run left it: every writer committed it."""
    rec = fmt.build_record("ml", "llama", 500, writers)
    rec["metadata"]["creationTimestamp"] = timestamp(MADE)
    rec = folded(rec, {w: claim("Local", MADE) for w in range(writers)}, MADE)
    done = MADE + timedelta(minutes=2)
    return folded(rec, {w: claim("Global", done) for w in range(writers)}, done)


def test_a_first_run_keeps_the_records_creation() -> None:
    rec = committed()
    assert "capturedTime" not in rec["status"]
    assert document.step_times([rec]) == {500: timestamp(MADE)}


def test_a_step_captured_again_is_dated_by_its_new_run() -> None:
    rec = folded(committed(), {0: claim("Local", AGAIN)}, AGAIN + timedelta(seconds=3))
    assert rec["status"]["capturedTime"] == timestamp(AGAIN)
    assert rec["status"]["recaptured"] == "0"
    assert document.step_times([rec]) == {500: timestamp(AGAIN)}


def test_the_recency_of_a_redone_step_counts_from_the_redo() -> None:
    """The bug: the pod domain named step 500 with the failed run's time, so
    the work at risk looked ten minutes larger than it was until step 600."""
    rec = folded(committed(), {w: claim("Local", AGAIN) for w in range(3)}, AGAIN)
    doc = document.document("llama", {"lastLocalStep": 500}, [rec])
    assert doc["pod"] == {"step": 500, "time": timestamp(AGAIN)}


def test_writers_of_one_run_reporting_one_by_one_keep_the_first_ones_time() -> None:
    rec = folded(committed(), {0: claim("Local", AGAIN)}, AGAIN)
    later = AGAIN + timedelta(seconds=4)
    rec = folded(rec, {0: claim("Local", AGAIN), 2: claim("Local", later)}, later)
    assert rec["status"]["capturedTime"] == timestamp(AGAIN)
    assert rec["status"]["recaptured"] == "0,2"
    # The run goes on: its writers commit the step again, which dates nothing.
    done = later + timedelta(minutes=1)
    rec = folded(rec, {w: claim("Global", done) for w in range(3)}, done)
    assert rec["status"]["capturedTime"] == timestamp(AGAIN)
    assert rec["status"]["state"] == "Global"


def test_a_writer_starting_over_twice_begins_a_newer_run() -> None:
    rec = folded(committed(), {0: claim("Local", AGAIN)}, AGAIN)
    done = AGAIN + timedelta(minutes=1)
    rec = folded(rec, {0: claim("Global", done)}, done)
    third = AGAIN + timedelta(minutes=20)
    rec = folded(rec, {0: claim("Local", third)}, third)
    assert rec["status"]["capturedTime"] == timestamp(third)
    assert rec["status"]["recaptured"] == "0"


def test_a_claim_dated_in_the_future_counts_as_now() -> None:
    """Pods are not trusted: a clock far ahead must not make the work at risk negative."""
    rec = folded(committed(), {1: claim("Local", AGAIN + timedelta(days=3))}, AGAIN)
    assert rec["status"]["capturedTime"] == timestamp(AGAIN)


def test_a_writer_that_fails_or_moves_on_has_not_started_over() -> None:
    rec = fmt.build_record("ml", "llama", 500, 2)
    rec = folded(rec, {0: claim("Local", MADE), 1: claim("Local", MADE)}, MADE)
    rec = folded(rec, {0: claim("Global", AGAIN)}, AGAIN)
    failed = Claim(state="Failed", bytes=100, at=timestamp(AGAIN), message="verify: mismatch")
    rec = folded(rec, {0: claim("Global", AGAIN), 1: failed}, AGAIN)
    assert "capturedTime" not in rec["status"] and "recaptured" not in rec["status"]


def test_an_unreadable_recaptured_starts_the_account_afresh() -> None:
    rec = committed()
    rec["status"] |= {"capturedTime": timestamp(MADE), "recaptured": "not ranks"}
    rec = folded(rec, {1: claim("Local", AGAIN)}, AGAIN)
    assert rec["status"]["capturedTime"] == timestamp(AGAIN)
    assert rec["status"]["recaptured"] == "1"


def test_a_drain_paused_within_one_run_is_not_a_new_capture() -> None:
    """The agent steps back from Draining to Local when a drain is paused or
    superseded; dating the step by the pause would understate the work at risk."""
    rec = fmt.build_record("ml", "llama", 500, 2)
    rec["metadata"]["creationTimestamp"] = timestamp(MADE)
    rec = folded(rec, {w: claim("Local", MADE) for w in range(2)}, MADE)
    draining = MADE + timedelta(seconds=30)
    rec = folded(rec, {0: claim("Draining", draining)}, draining)
    paused = MADE + timedelta(minutes=3)
    rec = folded(rec, {0: claim("Local", paused)}, paused)
    assert "capturedTime" not in rec["status"] and "recaptured" not in rec["status"]
    assert document.step_times([rec]) == {500: timestamp(MADE)}


def test_a_writer_that_failed_and_captures_again_dates_the_new_run() -> None:
    rec = fmt.build_record("ml", "llama", 500, 2)
    rec["metadata"]["creationTimestamp"] = timestamp(MADE)
    rec = folded(rec, {w: claim("Local", MADE) for w in range(2)}, MADE)
    failed = Claim(state="Failed", bytes=100, at=timestamp(MADE), message="local copy unreadable")
    rec = folded(rec, {1: failed}, MADE + timedelta(minutes=1))
    rec = folded(rec, {1: claim("Capturing", AGAIN)}, AGAIN)
    assert rec["status"]["capturedTime"] == timestamp(AGAIN)
    assert rec["status"]["recaptured"] == "1"


def test_a_huge_recaptured_range_is_read_as_ranges_cut_to_the_writers() -> None:
    """A hand edit naming ranks by the trillion: expanded, it would take the
    operator's memory and the record's fold would never progress again. The
    alarm only turns such a hang into a failure."""
    rec = committed(writers=8)
    rec["status"] |= {"capturedTime": timestamp(AGAIN), "recaptured": "5-1000000000000"}
    later = AGAIN + timedelta(seconds=5)
    signal.signal(signal.SIGALRM, _too_long)
    signal.alarm(20)
    try:
        joined = folded(rec, {1: claim("Local", later)}, later)
        newer = folded(rec, {6: claim("Local", later)}, later)
    finally:
        signal.alarm(0)
    assert joined["status"]["recaptured"] == "1,5-7"  # ranks past the 8 writers dropped
    assert joined["status"]["capturedTime"] == timestamp(AGAIN)
    assert newer["status"]["recaptured"] == "6"  # already there: a newer run
    assert newer["status"]["capturedTime"] == timestamp(later)


def _too_long(signum: int, frame: object) -> None:
    raise TimeoutError("the fold expanded status.recaptured")


def test_a_recapture_is_never_dated_before_the_records_creation() -> None:
    """A pod clock behind the apiserver's would date the step before the job
    first reached it, overstating the work at risk beyond the first run."""
    rec = folded(committed(), {0: claim("Local", MADE - timedelta(hours=1))}, AGAIN)
    assert rec["status"]["capturedTime"] == timestamp(MADE)


def test_an_unreadable_captured_time_falls_back_to_the_records_creation() -> None:
    rec = committed()
    rec["status"]["capturedTime"] = "yesterday"
    assert document.step_times([rec]) == {500: timestamp(MADE)}


def test_recaptured_as_written_is_what_the_crd_accepts() -> None:
    """Twenty thousand scattered writers starting over: the ranges would run
    past the CRD's maxLength, and a status the apiserver refuses would stop
    the record's fold for good."""
    schema = yaml.safe_load((ROOT / "crds" / "checkpoints.yaml").read_text())
    field = schema["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["status"]["properties"]["recaptured"]
    scattered = range(0, 40_000, 2)
    change = recapture.recapture({}, dict.fromkeys(scattered, "Global"),
                                 {r: claim("Local", AGAIN) for r in scattered},
                                 AGAIN, writers=40_000, created=timestamp(MADE))
    written = change["recaptured"]
    assert field["maxLength"] == recapture.MAX_RECAPTURED
    assert 0 < len(written) <= field["maxLength"]
    assert re.fullmatch(field["pattern"], written)
    assert written.startswith("0,2,4,") and change["capturedTime"] == timestamp(AGAIN)
