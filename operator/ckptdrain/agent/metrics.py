"""The agent's Prometheus metrics and its /metrics + /healthz endpoint.

A drain that silently stops must be impossible to miss: besides byte
counters, the agent exports the recovery point per tier (age of the newest
checkpoint in it) and the drain lag (bytes captured locally but not yet
global). Alert on `ckptdrain_recovery_point_age_seconds{tier="global"}`.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_DURATION_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
TIERS = ("local", "global")


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
        self.capture_seconds = Histogram(
            "ckptdrain_capture_seconds", "Time to capture one checkpoint",
            buckets=_DURATION_BUCKETS, registry=r)
        self.drain_seconds = Histogram(
            "ckptdrain_drain_seconds", "Time to drain one checkpoint",
            buckets=_DURATION_BUCKETS, registry=r)
        self.errors = Counter(
            "ckptdrain_errors", "Failures by phase (each is retried)", ["phase"], registry=r)
        self._recovery: dict[str, float | None] = dict.fromkeys(TIERS)
        age = Gauge(
            "ckptdrain_recovery_point_age_seconds",
            "Age of the newest checkpoint in each tier (the recovery point);"
            " -1 when the tier holds none", ["tier"], registry=r)
        for tier in TIERS:
            age.labels(tier).set_function(lambda t=tier: self._age(t))
        for phase in ("capture", "drain", "retention", "request"):
            self.errors.labels(phase)
        self._heartbeat = time.monotonic()

    def _age(self, tier: str) -> float:
        created = self._recovery[tier]
        return -1.0 if created is None else max(0.0, time.time() - created)

    def recovery_point(self, tier: str, step: int, created: float) -> None:
        """Record that `step`, created at wall time `created`, is durable in `tier`."""
        current = self._recovery[tier]
        if current is None or created >= current:
            self._recovery[tier] = created
            self.last_step.labels(tier).set(step)

    def set_share(self, rate: float, source: str) -> None:
        for other in ("file", "default"):
            self.share.labels(other).set(rate if other == source else 0)
        self.rate.set(rate)

    def beat(self) -> None:
        """The main loop is alive."""
        self._heartbeat = time.monotonic()

    def healthy(self, max_silence: float) -> bool:
        return time.monotonic() - self._heartbeat < max_silence


class MetricsServer:
    """Serves /metrics and /healthz on `port` (0 picks a free one) in a thread."""

    def __init__(self, metrics: AgentMetrics, port: int, *, host: str = "0.0.0.0",
                 max_silence: float = 30.0) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] == "/metrics":
                    body, ctype, code = generate_latest(metrics.registry), CONTENT_TYPE_LATEST, 200
                elif self.path.split("?")[0] == "/healthz":
                    ok = metrics.healthy(outer.max_silence)
                    body, ctype = (b"ok\n" if ok else b"main loop stalled\n"), "text/plain"
                    code = 200 if ok else 503
                else:
                    body, ctype, code = b"not found\n", "text/plain", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # scrapes every 15 s would drown the agent's own log

        self.max_silence = max_silence
        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="metrics",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
