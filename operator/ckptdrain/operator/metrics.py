"""Prometheus metrics of the operator (served on CKPTDRAIN_METRICS_PORT)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("ckptdrain_reconciles_total", "Reconciles by kind and outcome",
                     ["kind", "outcome"])
RECONCILE_SECONDS = Histogram("ckptdrain_reconcile_seconds", "Reconcile latency", ["kind"])
WEBHOOK_SECONDS = Histogram("ckptdrain_webhook_seconds", "Admission latency",
                            ["webhook", "outcome"],
                            buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
ALLOCATION_CHANGES = Counter("ckptdrain_allocation_changes_total",
                             "Pod bandwidth shares rewritten", ["namespace", "policy"])
RETENTION_EXPIRED = Counter("ckptdrain_checkpoints_expired_total",
                            "Checkpoint records expired by retention", ["namespace", "policy"])
UNPROTECTED_PODS = Gauge("ckptdrain_unprotected_pods",
                         "Selected pods running without injection (no restore, never "
                         "drained); delete them to recreate them through admission",
                         ["namespace", "policy"])


@contextmanager
def reconciling(kind: str) -> Iterator[None]:
    """Count and time one reconcile; an exception counts as an error and propagates."""
    start = time.perf_counter()
    try:
        yield
    except Exception:
        RECONCILES.labels(kind, "error").inc()
        raise
    else:
        RECONCILES.labels(kind, "ok").inc()
    finally:
        RECONCILE_SECONDS.labels(kind).observe(time.perf_counter() - start)


@contextmanager
def admitting(webhook: str) -> Iterator[None]:
    start = time.perf_counter()
    outcome = "error"
    try:
        yield
        outcome = "ok"
    finally:
        WEBHOOK_SECONDS.labels(webhook, outcome).observe(time.perf_counter() - start)
