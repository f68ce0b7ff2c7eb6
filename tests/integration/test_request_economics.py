"""The request model (economics.py) against what a real drain and restore send,
on SeaweedFS and MinIO, counted by the store's own gate."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from tests.support.s3servers import S3Server

from ckptdrain import economics
from ckptdrain.congestion import CongestionSettings
from ckptdrain.store.s3 import S3Store
from ckptdrain.store.s3_throttle import ThrottleGate
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.fetch import fetch
from ckptdrain.transfer.scan import build_manifest

pytestmark = pytest.mark.integration
PART = 5 << 20


def test_drain_and_restore_send_what_the_model_says(
        s3server: S3Server, s3area: tuple[str, str], tmp_path: Path) -> None:
    gate = ThrottleGate(CongestionSettings())
    store = S3Store(s3area[0], s3area[1], endpoint_url=s3server.endpoint_url,
                    region=s3server.region, access_key=s3server.access_key,
                    secret_key=s3server.secret_key, gate=gate)
    src = tmp_path / "step-1"
    src.mkdir()
    sizes = [12 * (1 << 20) + 5, 1000, 3 * PART]
    for i, size in enumerate(sizes):
        (src / f"f{i}.bin").write_bytes(random.Random(i).randbytes(size))
    before = gate.counts
    for writer in range(2):
        manifest = build_manifest(src, 1, writer, 2, created=time.time())
        Drainer(store, part_size=PART).drain(src, manifest,
                                             journal_path=tmp_path / f"j{writer}")
    sent = gate.counts.minus(before)
    put, get, lst = economics.drain_requests(sizes, PART)
    # One PUT more, once per store and process: the probe of whether the
    # server checks x-amz-checksum-crc32c (s3_checksum_probe.py).
    assert (sent.put, sent.get) == (2 * put + 1, 2 * get)
    # MinIO lists unfinished uploads by exact key only: one more listing, of the bucket's.
    assert sent.list in (2 * lst, 2 * (lst + 1))
    assert 2 * sum(sizes) < sent.bytes_up < 2 * sum(sizes) + 2 * 4096  # data + 2 manifests
    before = gate.counts
    fetch(store, tmp_path / "out", writer=0, part_size=PART)
    got = gate.counts.minus(before)
    r_get, r_list = economics.restore_requests(sizes, PART, writers=2, manifests=2)
    assert (got.get, got.list, got.put) == (r_get, r_list, 0)
    assert got.bytes_down >= sum(sizes)
