"""Drain and restore against real stores: file://, SeaweedFS and MinIO."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ckptdrain import keys
from ckptdrain.errors import IntegrityError, UnsafePath
from ckptdrain.ratelimit import TokenBucket
from ckptdrain.store.base import Store
from ckptdrain.store.gcs import GcsStore
from ckptdrain.store.s3 import S3Store
from ckptdrain.transfer import journal as jr
from ckptdrain.transfer.catalog import complete_steps
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.fetch import fetch
from ckptdrain.transfer.scan import build_manifest

pytestmark = pytest.mark.integration
MiB = 1 << 20
PART = 5 * MiB  # S3's smallest part


class PartLog:
    """Wraps a real store; records every (key, part number) uploaded."""

    def __init__(self, inner: Store) -> None:
        self.inner, self.uri = inner, inner.uri
        self.sent: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    @property
    def min_part_size(self) -> int:
        return self.inner.min_part_size

    def upload_part(self, key: str, upload_id: str, number: int, data: Any,
                    crc32c: int | None = None) -> Any:
        with self._lock:
            self.sent.append((key, number))
        return self.inner.upload_part(key, upload_id, number, data, crc32c)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def checkpoint(root: Path, seed: int, big: int = 23 * MiB + 17, shards: int = 12) -> Path:
    rng = random.Random(seed)
    (root / "shards").mkdir(parents=True)
    (root / "model.bin").write_bytes(rng.randbytes(big))
    for i in range(shards):
        (root / "shards" / f"rank{i:02d}.pt").write_bytes(rng.randbytes(rng.randrange(0, 300_000)))
    return root


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def push(store: Any, src: Path, step: int, journal: Path, **kw: Any) -> Any:
    manifest = build_manifest(src, step, 0, 1, created=time.time())
    return Drainer(store, part_size=PART, concurrency=4, **kw).drain(
        src, manifest, journal_path=journal)


def test_round_trip_large_file_and_shards(store: Store, tmp_path: Path) -> None:
    src = checkpoint(tmp_path / "src", seed=1)
    result = push(store, src, 100, tmp_path / "j")
    assert result.parts_sent >= 5 + 12
    got = fetch(store, tmp_path / "dest", concurrency=8)
    assert got.step == 100 and got.skipped == []
    assert tree(tmp_path / "dest") == tree(src)
    assert [c.step for c in complete_steps(store)] == [100]


def test_pull_of_a_requested_step(store: Store, tmp_path: Path) -> None:
    old = checkpoint(tmp_path / "old", seed=2, big=6 * MiB)
    new = checkpoint(tmp_path / "new", seed=3, big=6 * MiB)
    push(store, old, 1, tmp_path / "j1")
    push(store, new, 2, tmp_path / "j2")
    assert fetch(store, tmp_path / "d1", step=1).step == 1
    assert tree(tmp_path / "d1") == tree(old)


def test_corrupt_object_detected_and_previous_step_restored(store: Store, tmp_path: Path) -> None:
    old = checkpoint(tmp_path / "old", seed=4, big=11 * MiB)
    new = checkpoint(tmp_path / "new", seed=5, big=11 * MiB)
    push(store, old, 10, tmp_path / "j1")
    pushed = push(store, new, 20, tmp_path / "j2")
    key = keys.data_key(20, 0, "model.bin", pushed.attempt)
    data = bytearray(new.joinpath("model.bin").read_bytes())
    data[7 * MiB] ^= 0x01  # same size, one bit off, in the second part
    store.put_bytes(key, bytes(data))
    got = fetch(store, tmp_path / "dest")
    assert got.step == 10
    assert len(got.skipped) == 1 and "step 20" in got.skipped[0] and "CRC32C" in got.skipped[0]
    assert tree(tmp_path / "dest") == tree(old)
    with pytest.raises(IntegrityError):
        fetch(store, tmp_path / "dest20", step=20)
    assert not (tmp_path / "dest20").exists()


@pytest.mark.parametrize("bad", ["../../outside", "/etc/cron.d/x", "ok/../../x"])
def test_traversal_manifest_refused_before_anything_is_written(
        store: Store, tmp_path: Path, bad: str) -> None:
    doc = {"format": 1, "step": 5, "writer": 0, "writers": 1, "created": 1.0,
           "files": [{"path": "fine.bin", "size": 1, "crc32c": "00000000"},
                     {"path": bad, "size": 1, "crc32c": "00000000"}]}
    store.put_bytes(keys.data_key(5, 0, "fine.bin", None), b"x")
    store.put_bytes(keys.manifest_key(5, 0), json.dumps(doc).encode())
    assert complete_steps(store) == []
    (tmp_path / "restore").mkdir()
    with pytest.raises(UnsafePath):
        fetch(store, tmp_path / "restore" / "dest", step=5)
    assert list((tmp_path / "restore").iterdir()) == []


def cli_target(store: Store, request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    """The URI and environment that let a `ckptdrain` subprocess reach `store`."""
    env = dict(os.environ)
    if isinstance(store, S3Store):
        server = request.getfixturevalue("store_server")
        env.update(CKPTDRAIN_S3_ENDPOINT=server.endpoint_url, AWS_ACCESS_KEY_ID=server.access_key,
                   AWS_SECRET_ACCESS_KEY=server.secret_key, AWS_DEFAULT_REGION=server.region)
    if isinstance(store, GcsStore):  # an emulator: plain http, asked anonymously
        env["STORAGE_EMULATOR_HOST"] = store.endpoint.split("://", 1)[1]
    return store.uri, env


def test_sigkill_mid_push_then_resume_sends_no_finished_part_again(
        store: Store, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    src = checkpoint(tmp_path / "step-7", seed=6, big=40 * MiB, shards=4)
    journal = tmp_path / "journal.json"
    uri, env = cli_target(store, request)
    # Throttled so that it is surely mid-upload when killed.
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptdrain", "push", str(src), uri, "--rate", "20MB/s",
         "--part-size", "5MiB", "--concurrency", "2", "--journal", str(journal), "-q"],
        env=env, stderr=subprocess.PIPE)
    try:
        while True:  # until a few parts are journaled
            state = jr.load(journal)
            if state is not None and sum(len(f.parts) for f in state.files.values()) >= 3:
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert complete_steps(store) == []  # a partial checkpoint is never visible
    killed = jr.load(journal)
    assert killed is not None and not killed.manifest_written
    durable = {(f.key, n) for f in killed.files.values() for n in f.parts}

    logged = PartLog(store)
    result = push(logged, src, 7, journal)
    assert durable and not durable & set(logged.sent)
    assert result.resumed_bytes >= 3 * PART
    assert [c.step for c in complete_steps(store)] == [7]
    fetch(store, tmp_path / "dest")
    assert tree(tmp_path / "dest") == tree(src)


def test_rate_change_mid_drain_is_honoured_within_2s(store: Store, tmp_path: Path) -> None:
    """On the limiter's own (simulated) clock: 10 MB/s, then 2 MB/s from t = 2 s."""
    src = checkpoint(tmp_path / "src", seed=7, big=30 * MiB, shards=0)
    now = [0.0]
    samples: list[tuple[float, int]] = []

    def sleep(seconds: float) -> None:
        samples.append((now[0], limiter.granted))
        now[0] += seconds
        if now[0] >= 2.0 and limiter.rate == 10e6:
            limiter.set_rate(2e6)
            samples.append((now[0], -1))  # marks the change

    limiter = TokenBucket(10e6, clock=lambda: now[0], sleep=sleep)
    manifest = build_manifest(src, 1, 0, 1, created=0.0)
    Drainer(store, limiter=limiter, part_size=PART, concurrency=1).drain(
        src, manifest, journal_path=tmp_path / "j")
    samples.append((now[0], limiter.granted))
    changed = next(t for t, g in samples if g == -1)
    points = [(t, g) for t, g in samples if g >= 0]
    before = [(t, g) for t, g in points if t <= changed]
    after = [(t, g) for t, g in points if t >= changed + 2.0]
    rate = lambda pts: (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])  # noqa: E731
    assert rate(before) == pytest.approx(10e6, rel=0.05)
    assert rate(after) == pytest.approx(2e6, rel=0.05)
    assert limiter.granted == manifest.total_bytes
