"""The agent's metrics about its store: stalls, throttling and what requests cost.

Registered on the agent's registry (agent/metrics.py) by one call; kept in
a room of their own so the rest of the metrics can change shape freely.

- `ckptdrain_drain_stalls`: drain attempts cancelled for making no progress
  for drain.stallTimeout (each is retried). Alert on any increase.
- `ckptdrain_store_requests{class}` / `ckptdrain_store_bytes{direction}`:
  requests by billing class (put, get, list, delete) and bytes, as sent.
- `ckptdrain_store_throttle_events` / `ckptdrain_store_window`: congestion
  events (503 SlowDown, 429, timeouts) and the requests the process may
  keep in flight now (the shared AIMD window, store/s3_throttle.py).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from ckptdrain.request_counts import RequestCounts

CLASSES = ("put", "get", "list", "delete")


class StoreMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.stalls = Counter(
            "ckptdrain_drain_stalls",
            "Drain attempts cancelled for making no progress for drain.stallTimeout",
            registry=r)
        self.requests = Counter(
            "ckptdrain_store_requests", "Requests sent to the store, by billing class",
            ["class"], registry=r)
        self.bytes = Counter(
            "ckptdrain_store_bytes", "Bytes sent to and read from the store",
            ["direction"], registry=r)
        self.throttle_events = Gauge(
            "ckptdrain_store_throttle_events",
            "Congestion events (503 SlowDown, 429, timeouts) since the agent started",
            registry=r)
        self.window = Gauge(
            "ckptdrain_store_window",
            "Requests the agent may keep in flight to the store now (shared back-off)",
            registry=r)
        for cls in CLASSES:
            self.requests.labels(cls)
        for direction in ("up", "down"):
            self.bytes.labels(direction)

    def add_requests(self, spent: RequestCounts) -> None:
        """Count what one checkpoint's drain (or any piece of work) sent."""
        for cls in CLASSES:
            self.requests.labels(cls).inc(max(0, getattr(spent, cls)))
        self.bytes.labels("up").inc(max(0, spent.bytes_up))
        self.bytes.labels("down").inc(max(0, spent.bytes_down))

    def watch_gate(self, gate: Any) -> None:
        """Read the throttle state from `gate` (a ThrottleGate) at each scrape."""
        self.throttle_events.set_function(lambda: gate.state().events)
        self.window.set_function(lambda: gate.state().window)
