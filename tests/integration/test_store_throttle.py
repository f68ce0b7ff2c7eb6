"""Throttling against real SeaweedFS and MinIO behind a proxy that says "slow down".

The proxy (tests/support/s3proxy.py) answers 503 SlowDown / 429 or holds
requests; everything else reaches the real server. What a user would
notice: the checkpoint still arrives whole, the process as a whole pressed
less (fewer requests in flight after the store complained), and it
recovers once the store stops complaining.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tests.support.s3proxy import S3FaultProxy
from tests.support.s3servers import S3Server

from ckptdrain.congestion import CongestionSettings
from ckptdrain.errors import StoreUnreachable
from ckptdrain.ratelimit import TokenBucket
from ckptdrain.store.s3 import S3Store
from ckptdrain.store.s3_throttle import ThrottleGate
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.drain_run import DrainCancelled
from ckptdrain.transfer.fetch import fetch
from ckptdrain.transfer.scan import build_manifest

pytestmark = pytest.mark.integration
MiB = 1 << 20


def _store(server: S3Server, area: tuple[str, str], url: str, gate: ThrottleGate,
           **kw: Any) -> S3Store:
    bucket, prefix = area
    return S3Store(bucket, prefix, endpoint_url=url, region=server.region,
                   access_key=server.access_key, secret_key=server.secret_key,
                   gate=gate, **kw)


def _files(root: Path, count: int, size: int, seed: int = 7) -> Path:
    rng = random.Random(seed)
    root.mkdir(parents=True)
    for i in range(count):
        (root / f"shard{i:02d}.bin").write_bytes(rng.randbytes(size))
    return root


def _gate(max_window: int = 8) -> ThrottleGate:
    return ThrottleGate(CongestionSettings(max_window=max_window, backoff=0.05,
                                           max_backoff=0.5, cooldown=0.05))


def test_slowdown_on_every_request_over_a_limit_shrinks_the_window_and_the_data_arrives(
        s3server: S3Server, s3area: tuple[str, str], tmp_path: Path) -> None:
    src = _files(tmp_path / "step-1", count=24, size=200_000)
    with S3FaultProxy(s3server.endpoint_url) as proxy:
        proxy.max_in_flight = 2  # like a prefix over its request rate
        gate = _gate(max_window=32)  # more than the 8 workers ever fill
        store = _store(s3server, s3area, proxy.url, gate, max_attempts=10)
        manifest = build_manifest(src, 1, 0, 1, created=time.time())
        Drainer(store, part_size=5 * MiB, concurrency=8).drain(
            src, manifest, journal_path=tmp_path / "journal")
        state = gate.state()
        assert proxy.throttled > 0  # the store did complain
        # The whole process slowed down: fewer requests out than its 8 workers.
        assert state.events >= 1 and state.lowest_window < 8
        # Retries did not stampede: after the first complaint, far fewer
        # requests met a full server than were sent.
        assert proxy.throttled < proxy.forwarded
    result = fetch(_store(s3server, s3area, s3server.endpoint_url, _gate()), tmp_path / "out")
    assert result.step == 1
    for f in src.iterdir():
        assert (tmp_path / "out" / f.name).read_bytes() == f.read_bytes()


def test_after_the_store_stops_complaining_the_window_grows_back(
        s3server: S3Server, s3area: tuple[str, str]) -> None:
    with S3FaultProxy(s3server.endpoint_url) as proxy:
        gate = _gate(max_window=8)
        store = _store(s3server, s3area, proxy.url, gate, max_attempts=10)
        proxy.throttle_next(3, status=429, code="TooManyRequests")
        store.put_bytes("a", b"x")  # three 429s, then through
        low = gate.state().window
        assert proxy.throttled == 3 and low < 8
        for i in range(60):
            store.put_bytes(f"k{i}", b"y")
        assert gate.state().window > low  # additive increase: it recovers
        assert store.get_bytes("a") == b"x"


def test_a_store_that_keeps_throttling_fails_the_request_clearly(
        s3server: S3Server, s3area: tuple[str, str]) -> None:
    with S3FaultProxy(s3server.endpoint_url) as proxy:
        store = _store(s3server, s3area, proxy.url, _gate(), max_attempts=3)
        proxy.throttle_next(100)
        with pytest.raises(StoreUnreachable, match="SlowDown"):
            store.put_bytes("a", b"x")
        assert proxy.throttled == 3  # exactly the attempts, no more


def test_a_request_that_is_never_answered_times_out_and_is_retried(
        s3server: S3Server, s3area: tuple[str, str]) -> None:
    with S3FaultProxy(s3server.endpoint_url) as proxy:
        gate = _gate()
        store = _store(s3server, s3area, proxy.url, gate, read_timeout=1.0, max_attempts=4)
        proxy.stall_next(1)
        store.put_bytes("held", b"payload")
        assert proxy.stalled == 1
        assert gate.state().signals >= 1  # the timeout counted as congestion
        assert store.get_bytes("held") == b"payload"


def test_requests_and_bytes_are_counted_by_class(
        s3server: S3Server, s3area: tuple[str, str]) -> None:
    gate = _gate()
    store = _store(s3server, s3area, s3server.endpoint_url, gate)
    # A store's first whole object is preceded by its checksum probe
    # (s3_checksum_probe.py): one PUT, refused, once per store.
    first = gate.counts
    store.put_bytes("warm", b"x")
    probe = gate.counts.minus(first)
    assert (probe.put, probe.get, probe.list, probe.delete) == (2, 0, 0, 0)
    before = gate.counts
    store.put_bytes("a", b"12345")
    assert store.get_bytes("a") == b"12345"
    assert store.head("a") is not None
    list(store.list(""))
    store.delete("a")
    spent = gate.counts.minus(before)
    assert (spent.put, spent.get, spent.list, spent.delete) == (1, 2, 1, 1)
    assert spent.bytes_up == 5 and spent.bytes_down == 5


def test_a_drain_stopped_while_its_bodies_are_sent_is_not_congestion(
        s3server: S3Server, s3area: tuple[str, str], tmp_path: Path) -> None:
    """A superseded drain stops mid-body (its pacer raises). botocore reports
    that as a failed HTTP request; read as a dropped connection it halved the
    window, paused every drain of the process and retried each stopped
    request, so a newer step waited minutes behind the one it superseded."""
    src = _files(tmp_path / "step-1", count=8, size=1_000_000)
    gate = _gate(max_window=8)
    store = _store(s3server, s3area, s3server.endpoint_url, gate)
    limiter = TokenBucket(1_000_000)  # 8 s of bodies: the cancel lands inside them
    cancel = threading.Event()

    def cancel_mid_body() -> None:
        while limiter.granted < 500_000 and not cancel.is_set():
            time.sleep(0.01)
        cancel.set()

    watcher = threading.Thread(target=cancel_mid_body, daemon=True)
    watcher.start()
    with pytest.raises(DrainCancelled):
        Drainer(store, limiter=limiter, part_size=8 * MiB, concurrency=4).drain(
            src, build_manifest(src, 1, 0, 1, created=time.time()),
            journal_path=tmp_path / "journal-1", cancel=cancel)
    watcher.join()
    state = gate.state()
    assert (state.signals, state.window, state.in_flight, state.paused) == (0, 8, 0, False)
    # Every stopped request was sent once, not retried by the gate.
    # Each worker's stopped request went once, not retried through the gate;
    # one more PUT is the store's checksum probe.
    assert gate.counts.put <= 4 + 1
    result = Drainer(store, concurrency=4).drain(
        src, build_manifest(src, 2, 0, 1, created=time.time()), journal_path=tmp_path / "journal-2")
    assert result.sent_bytes == 8_000_000 and gate.state().signals == 0
