"""The agent's metrics as a scrape shows them: timestamps absent until known
(never a sentinel), bounded labels, restore results and drain error kinds;
and the /metrics endpoint served by a real HTTP server."""

from __future__ import annotations

import time
import urllib.request

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ckptdrain import errors
from ckptdrain.agent.metrics import (
    DRAIN_ERROR_KINDS,
    AgentMetrics,
    MetricsServer,
    drain_error_kind,
    restore_fallbacks,
)


def samples(m: AgentMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(m.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def named(m: AgentMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples(m).items() if n == name}


def test_recovery_point_is_absent_until_a_tier_holds_a_checkpoint() -> None:
    m = AgentMetrics()
    assert named(m, "ckptdrain_last_checkpoint_timestamp_seconds") == {}
    # No -1 sentinel: an `age > X` alert must not be silently false.
    assert named(m, "ckptdrain_recovery_point_age_seconds") == {}
    created = time.time() - 30
    m.recovery_point("local", 7, created)
    stamps = named(m, "ckptdrain_last_checkpoint_timestamp_seconds")
    assert stamps == {(("tier", "local"),): created}
    (age,) = named(m, "ckptdrain_recovery_point_age_seconds").values()
    assert 30 <= age < 3600
    # An older step arriving later (a resumed drain) never moves it back.
    m.recovery_point("local", 5, created - 100)
    assert named(m, "ckptdrain_last_checkpoint_timestamp_seconds")[(("tier", "local"),)] == created
    assert named(m, "ckptdrain_last_step")[(("tier", "local"),)] == 7


def test_start_time_and_intervals_let_an_alert_see_a_job_that_never_drained() -> None:
    before = time.time()
    m = AgentMetrics()
    (started,) = named(m, "ckptdrain_agent_start_timestamp_seconds").values()
    assert before - 1 <= started <= time.time()
    m.set_intervals(60.0, 5, drains=True)
    assert named(m, "ckptdrain_checkpoint_interval_seconds") == {
        (("tier", "local"),): 60.0, (("tier", "global"),): 300.0}
    local_only = AgentMetrics()
    local_only.set_intervals(60.0, 5, drains=False)
    assert named(local_only, "ckptdrain_checkpoint_interval_seconds") == {
        (("tier", "local"),): 60.0}


def test_drain_errors_are_counted_by_a_fixed_set_of_kinds() -> None:
    assert drain_error_kind(errors.StoreUnreachable("x")) == "unreachable"
    assert drain_error_kind(errors.StoreAccessDenied("x")) == "access_denied"
    assert drain_error_kind(errors.BucketMissing("x")) == "bucket_missing"
    assert drain_error_kind(errors.StoreError("x")) == "store"
    assert drain_error_kind(errors.CommitConflict("x")) == "commit_conflict"
    assert drain_error_kind(errors.IntegrityError("x")) == "integrity"
    assert drain_error_kind(OSError(28, "No space left")) == "local_io"
    assert drain_error_kind(RuntimeError("boom")) == "other"
    m = AgentMetrics()
    # Every kind is exported at 0 from the start, so rate() sees the first one.
    assert set(named(m, "ckptdrain_drain_errors_total")) == {
        (("kind", k),) for k, _ in DRAIN_ERROR_KINDS}
    m.drain_failed(errors.StoreAccessDenied("denied for key a/b/c"))
    assert named(m, "ckptdrain_drain_errors_total")[(("kind", "access_denied"),)] == 1
    assert named(m, "ckptdrain_errors_total")[(("phase", "drain"),)] == 1


def _result(**fields: object) -> dict[str, object]:
    doc: dict[str, object] = {"outcome": "restored", "step": 40, "tier": "global",
                              "skipped": [], "at": 1.0}
    doc.update(fields)
    return doc


def test_restore_fallbacks_count_only_newer_or_equal_candidates() -> None:
    assert restore_fallbacks(_result()) == 0
    skipped = [{"step": 42, "tier": "local", "reason": "crc"},
               {"step": 40, "tier": "local", "reason": "crc"},
               {"step": 30, "tier": "global", "reason": "older, never tried"},
               {"step": None, "tier": "global", "reason": "listing failed"}]
    assert restore_fallbacks(_result(skipped=skipped)) == 2
    assert restore_fallbacks(_result(step=None, outcome="none_verified",
                                     skipped=skipped)) == 3
    assert restore_fallbacks({"skipped": "garbage"}) == 0


def test_the_restore_result_becomes_one_outcome_series() -> None:
    m = AgentMetrics()
    assert named(m, "ckptdrain_restore_outcome") == {}
    m.restored(_result(skipped=[{"step": 41, "tier": "local", "reason": "crc"}]))
    assert named(m, "ckptdrain_restore_outcome") == {
        (("outcome", "restored"), ("tier", "global")): 1}
    assert named(m, "ckptdrain_restore_fallbacks") == {(): 1}
    # A fresh start has no tier; an unknown outcome never becomes a label.
    m.restored({"outcome": "fresh_start", "step": None, "tier": None})
    assert named(m, "ckptdrain_restore_outcome") == {
        (("outcome", "fresh_start"), ("tier", "none")): 1}
    m.restored({"outcome": "<script>", "step": 3, "tier": "/etc"})
    assert named(m, "ckptdrain_restore_outcome") == {
        (("outcome", "restored"), ("tier", "none")): 1}


def test_metrics_endpoint_serves_the_registry() -> None:
    m = AgentMetrics()
    m.recovery_point("global", 3, time.time())
    server = MetricsServer(m, 0, host="127.0.0.1")
    server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            body = r.read().decode()
    finally:
        server.stop()
    assert 'ckptdrain_last_checkpoint_timestamp_seconds{tier="global"}' in body
    assert "ckptdrain_drained_bytes_total 0.0" in body
