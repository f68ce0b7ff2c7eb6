"""A drain that stops moving fails and is retried (no silent stall), and a
writer's orphaned uploads are aborted, against real SeaweedFS and MinIO
(the stall made by a proxy that holds every request)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.support.s3proxy import S3FaultProxy
from tests.support.s3servers import S3Server

from ckptdrain import keys
from ckptdrain.agent.drainworker import DrainWorker
from ckptdrain.agent.metrics import AgentMetrics
from ckptdrain.agent.report import CheckpointEvent
from ckptdrain.congestion import CongestionSettings
from ckptdrain.node.localtier import LocalTier
from ckptdrain.store.s3 import S3Store
from ckptdrain.store.s3_throttle import ThrottleGate
from ckptdrain.transfer import journal as jr
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.orphans import abort_orphans

pytestmark = pytest.mark.integration
PART = 5 << 20


class Recorder:
    def __init__(self) -> None:
        self.events: list[CheckpointEvent] = []

    def report(self, event: CheckpointEvent) -> None:
        self.events.append(event)


def _wait(condition: Callable[[], bool], what: str, cap: float = 120.0) -> None:
    deadline = time.monotonic() + cap
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _store(server: S3Server, area: tuple[str, str], url: str, **kw: object) -> S3Store:
    gate = ThrottleGate(CongestionSettings(backoff=0.05, max_backoff=0.2, cooldown=0.05))
    return S3Store(area[0], area[1], endpoint_url=url, region=server.region,
                   access_key=server.access_key, secret_key=server.secret_key, gate=gate,
                   **kw)  # type: ignore[arg-type]


def test_a_drain_that_makes_no_progress_fails_visibly_and_is_retried(
        s3server: S3Server, s3area: tuple[str, str], tmp_path: Path) -> None:
    tier = LocalTier(tmp_path / "local")
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"\x07" * (2 * PART + 11))
    tier.capture(src, 1, writer=0, writers=1)
    with S3FaultProxy(s3server.endpoint_url) as proxy:
        store = _store(s3server, s3area, proxy.url, read_timeout=2.0, max_attempts=2)
        recorder, metrics = Recorder(), AgentMetrics()
        worker = DrainWorker(tier, store, Drainer(store, part_size=PART, concurrency=2),
                             recorder, metrics, part_size=PART, stall_after=1.0)
        proxy.stall_all = True  # the store takes requests and never answers
        worker.start()
        worker.submit(1)
        _wait(lambda: metrics.store.stalls._value.get() >= 1, "the stall to be seen")
        proxy.stall_all = False  # the store heals
        _wait(lambda: tier.is_global(1), "the retried drain")
        worker.stop(30)
    stalled = [e for e in recorder.events if "no progress for" in e.message]
    assert stalled and stalled[0].state.value == "Retrying"
    assert "drain.stallTimeout" in stalled[0].message
    final = recorder.events[-1]
    assert final.state.value == "Global"
    # Request economics: what the checkpoint cost, every attempt included.
    assert final.requests is not None
    # create, 3 parts, complete, the manifest: at least, retries of held ones besides
    assert final.requests["put"] >= 6
    assert final.requests["bytesUp"] >= 2 * PART + 11
    scrape = metrics.registry.get_sample_value
    assert scrape("ckptdrain_store_requests_total", {"class": "put"}) >= final.requests["put"]


def test_orphaned_uploads_of_the_writer_are_aborted_and_nothing_else(
        s3server: S3Server, s3area: tuple[str, str], tmp_path: Path) -> None:
    store = _store(s3server, s3area, s3server.endpoint_url)
    attempt = keys.new_attempt()
    orphan = keys.data_key(1, 2, "a.bin", attempt)
    resumed = keys.data_key(2, 2, "b.bin", attempt)
    other = keys.data_key(1, 3, "a.bin", attempt)
    ids = {k: store.create_multipart(k) for k in (orphan, resumed, other)}
    store.upload_part(orphan, ids[orphan], 1, b"x" * 1000)
    # A journal on this node that a drain will resume owns `resumed`.
    journal = jr.UploadJournal(store.uri, 2, 2, "id")
    journal.file("b.bin", resumed, 10 * PART, PART)
    journal.upload_started("b.bin", ids[resumed])
    # A predecessor may still be flushing: young uploads are spared.
    assert abort_orphans(store, 2, set(journal.open_uploads()), grace=3600.0) == 0
    assert abort_orphans(store, 2, set(journal.open_uploads()), grace=0.0) == 1
    left = {(u.key, u.upload_id) for u in store.list_multipart_uploads(keys.DATA)}
    assert left == {(resumed, ids[resumed]), (other, ids[other])}
    assert store.list_parts(orphan, ids[orphan]) is None  # gone, parts and all
