"""The agent's Prometheus metrics and its /metrics + /healthz endpoint.

A drain that silently stops must be impossible to miss. Besides byte
counters, the agent exports what an alert needs (docs/alerts.md):

- `ckptdrain_last_checkpoint_timestamp_seconds{tier}`: when the newest
  checkpoint durable in each tier was created (Unix time). Absent until the
  tier holds one: never a sentinel, which would make `age > X` silently false.
- `ckptdrain_agent_start_timestamp_seconds` and
  `ckptdrain_checkpoint_interval_seconds{tier}`: so that "no global checkpoint
  within N intervals of starting" is an alert too (a job that never drained).
- `ckptdrain_drain_lag_bytes`, `ckptdrain_drained_bytes_total`: a drain that
  has work and sends nothing is stalled.
- `ckptdrain_drain_errors_total{kind}`: failures by a small fixed set of kinds.
- `ckptdrain_restore_outcome{outcome,tier}` and `ckptdrain_restore_fallbacks`:
  what the restore before this agent did, and how many newer candidates it
  had to skip (a fallback to an older step or a slower tier).

Label values come from fixed sets (tiers, phases, kinds, outcomes): no step,
path or error text ever becomes a label.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ckptdrain import errors
from ckptdrain.agent.store_metrics import StoreMetrics
from ckptdrain.metrics_endpoint import MetricsEndpoint

_DURATION_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
TIERS = ("local", "peer", "global")
#: "prune": a work-dir step the agent could not remove (once per step); "resume":
#: a restore round after a restart in place not applied (the trainer's answer unwritten).
PHASES = ("capture", "drain", "retention", "cold_storage", "request", "prune", "resume")
#: Drain failure kinds, most specific class first (errors.py); anything else is "other".
DRAIN_ERROR_KINDS: tuple[tuple[str, type[BaseException] | None], ...] = (
    ("unreachable", errors.StoreUnreachable),
    ("access_denied", errors.StoreAccessDenied),
    ("bucket_missing", errors.BucketMissing),
    ("object_missing", errors.ObjectMissing),
    ("store", errors.StoreError),
    ("commit_conflict", errors.CommitConflict),
    ("integrity", errors.IntegrityError),
    ("local_io", OSError),
    ("other", None),
)
#: Restore outcomes (restore/result.py OUTCOMES) and the tiers a restore reads.
RESTORE_OUTCOMES = ("restored", "reshard", "fresh_start", "disabled", "cannot_place",
                    "store_unavailable", "none_verified", "history_elsewhere")
RESTORE_TIERS = ("local", "peer", "global", "none")


def drain_error_kind(err: BaseException) -> str:
    """The bounded label a drain failure is counted under."""
    for kind, cls in DRAIN_ERROR_KINDS:
        if cls is not None and isinstance(err, cls):
            return kind
    return "other"


def restore_fallbacks(doc: Mapping[str, object]) -> int:
    """Candidates the restore skipped that were at least as new as what it
    restored (all of them when it restored nothing): each one is a newer or
    faster copy that failed, so the job fell back past it."""
    restored = doc.get("step")
    skipped = doc.get("skipped")
    if not isinstance(skipped, list):
        return 0
    count = 0
    for entry in skipped:
        step = entry.get("step") if isinstance(entry, dict) else None
        if not isinstance(step, int):
            continue  # a listing that failed is not a candidate
        if not isinstance(restored, int) or step >= restored:
            count += 1
    return count


class _RecoveryPoints(Collector):
    """Timestamps and ages of the newest checkpoint per tier, only for tiers that hold one."""

    def __init__(self) -> None:
        self.created: dict[str, float] = {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        stamp = GaugeMetricFamily(
            "ckptdrain_last_checkpoint_timestamp_seconds",
            "Creation time (Unix) of the newest checkpoint durable in each tier;"
            " absent while the tier holds none", labels=["tier"])
        age = GaugeMetricFamily(
            "ckptdrain_recovery_point_age_seconds",
            "Age of the newest checkpoint in each tier (the recovery point);"
            " absent while the tier holds none", labels=["tier"])
        now = time.time()
        for tier in TIERS:
            created = self.created.get(tier)
            if created is not None:
                stamp.add_metric([tier], created)
                age.add_metric([tier], max(0.0, now - created))
        yield stamp
        yield age


class AgentMetrics:
    """All of the agent's metrics in their own registry (no global state)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.captured_bytes = Counter(
            "ckptdrain_captured_bytes", "Bytes durably copied into the local tier", registry=r)
        self.drained_bytes = Counter(
            "ckptdrain_drained_bytes", "Bytes sent to the global tier", registry=r)
        self.rate = Gauge(
            "ckptdrain_drain_rate_limit_bytes_per_second",
            "Rate the drain is limited to now", registry=r)
        self.share = Gauge(
            "ckptdrain_share_bytes_per_second",
            "Bandwidth share in force, by where it came from", ["source"], registry=r)
        self.lag_bytes = Gauge(
            "ckptdrain_drain_lag_bytes",
            "Bytes captured locally that are not yet global", registry=r)
        self.last_step = Gauge(
            "ckptdrain_last_step", "Newest step durable in each tier", ["tier"], registry=r)
        self.capture_files = Counter(
            "ckptdrain_capture_files", "Files taken into the local tier, by how: reflink "
            "(copy-on-write), link (hard link, the work dir on the tier's filesystem) or copy",
            ["method"], registry=r)
        self.capture_seconds = Histogram(
            "ckptdrain_capture_seconds", "Time to capture one checkpoint",
            buckets=_DURATION_BUCKETS, registry=r)
        self.drain_seconds = Histogram(
            "ckptdrain_drain_seconds", "Time to drain one checkpoint",
            buckets=_DURATION_BUCKETS, registry=r)
        self.errors = Counter(
            "ckptdrain_errors", "Failures by phase (each is retried)", ["phase"], registry=r)
        self.drain_errors = Counter(
            "ckptdrain_drain_errors", "Failed drain attempts by kind (each is retried)",
            ["kind"], registry=r)
        self.cold_objects = Counter(
            "ckptdrain_cold_objects",
            "Objects of older checkpoints moved to the policy's cold storage class", registry=r)
        self.started = Gauge(
            "ckptdrain_agent_start_timestamp_seconds",
            "When this agent started (Unix): with no global checkpoint N intervals"
            " later, the job has never been protected", registry=r)
        self.interval = Gauge(
            "ckptdrain_checkpoint_interval_seconds",
            "Time between checkpoints the policy asks for, per tier", ["tier"], registry=r)
        self.restore_outcome = Gauge(
            "ckptdrain_restore_outcome",
            "1 for the outcome of the restore that ran before this agent, by the tier"
            " it restored from (none when nothing was restored)", ["outcome", "tier"],
            registry=r)
        self.restore_fallbacks = Gauge(
            "ckptdrain_restore_fallbacks",
            "Newer or faster candidates that restore skipped (corrupt, incomplete,"
            " unreadable) before the one it used", registry=r)
        self._recovery = _RecoveryPoints()
        r.register(self._recovery)
        for phase in PHASES:
            self.errors.labels(phase)
        for kind, _ in DRAIN_ERROR_KINDS:
            self.drain_errors.labels(kind)
        self.started.set(time.time())
        self._heartbeat = time.monotonic()
        self.store = StoreMetrics(r)  # stalls, throttling, requests (agent/store_metrics.py)

    def recovery_point(self, tier: str, step: int, created: float) -> None:
        """Record that `step`, created at wall time `created`, is durable in `tier`."""
        current = self._recovery.created.get(tier)
        if current is None or created >= current:
            self._recovery.created[tier] = created
            self.last_step.labels(tier).set(step)

    def set_intervals(self, interval_s: float, global_every: int, drains: bool) -> None:
        """The policy's schedule: every local interval, every `global_every`-th goes
        global; no global interval without a store (nothing is expected there)."""
        self.interval.labels("local").set(interval_s)
        if drains:
            self.interval.labels("global").set(interval_s * global_every)

    def drain_failed(self, err: BaseException) -> None:
        self.errors.labels("drain").inc()
        self.drain_errors.labels(drain_error_kind(err)).inc()

    def restored(self, doc: Mapping[str, object]) -> None:
        """Export the restore result file (restore/result.py) this pod started with."""
        outcome = doc.get("outcome")
        tier = doc.get("tier") if doc.get("tier") in TIERS else "none"
        if outcome not in RESTORE_OUTCOMES:
            outcome = "restored" if doc.get("step") is not None else "fresh_start"
        self.restore_outcome.clear()
        self.restore_outcome.labels(outcome, tier).set(1)
        self.restore_fallbacks.set(restore_fallbacks(doc))

    def set_share(self, rate: float, source: str) -> None:
        for other in ("channel", "waiting", "file", "default"):
            self.share.labels(other).set(rate if other == source else 0)
        self.rate.set(rate)

    def beat(self) -> None:
        """The main loop is alive."""
        self._heartbeat = time.monotonic()

    def healthy(self, max_silence: float) -> bool:
        return time.monotonic() - self._heartbeat < max_silence


class MetricsServer(MetricsEndpoint):
    """Serves /metrics and /healthz on `port` (0 picks a free one) in a thread;
    /healthz fails once the main loop has not beaten for `max_silence` s."""

    def __init__(self, metrics: AgentMetrics, port: int, *, host: str = "0.0.0.0",
                 max_silence: float = 30.0) -> None:
        self.max_silence = max_silence
        super().__init__(metrics.registry, port,
                         lambda: metrics.healthy(self.max_silence), host=host)
