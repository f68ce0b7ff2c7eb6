"""Restore while a real SeaweedFS is stopped and started again: the init
step waits for the store (restore.retryDeadline) instead of failing the pod,
never settles for an older step, and gives up with exit 3 and the reason
only once the deadline has passed."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.agent_config import agent_config
from tests.support.s3servers import S3Server, start_seaweedfs

from ckptdrain.node import config
from ckptdrain.node.localtier import LocalTier
from ckptdrain.restore import command
from ckptdrain.transfer import direct_io, range_fetch
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.scan import build_manifest

SIZE = 6 << 20
#: Bounds on waiting for a process or a server, so a hang fails instead of hanging.
WAIT_S = 240


@pytest.fixture
def server(tmp_path: Path) -> Iterator[S3Server]:
    """A SeaweedFS of this test's own: the tests stop and restart it."""
    with start_seaweedfs(tmp_path / "s3") as running:
        try:
            yield running
        finally:
            # restart() replaced the process start_seaweedfs stops on exit.
            if running.process.poll() is None:
                running.process.terminate()
                try:
                    running.process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    running.process.kill()
                    running.process.wait(timeout=10)


def restart(server: S3Server, bucket: str) -> None:
    """Start the stopped server again on the same ports and data; wait until it serves."""
    for sock in ("filer.sock", "s3.sock"):
        (server.workdir / sock).unlink(missing_ok=True)
    with server.log_path.open("ab") as log:
        server.process = subprocess.Popen(server.process.args, cwd=server.workdir,
                                          env=dict(os.environ), stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        assert server.process.poll() is None, server.log_tail()
        with contextlib.suppress(Exception):
            client = server.client(connect_timeout=2, read_timeout=5)
            client.put_object(Bucket=bucket, Key="ready", Body=b"ok")
            client.delete_object(Bucket=bucket, Key="ready")
            return
        time.sleep(0.3)
    raise AssertionError(f"SeaweedFS did not serve again: {server.log_tail()}")


def _push(tmp_path: Path, store: Any, step: int, data: bytes) -> None:
    src = tmp_path / "src" / f"step-{step}"
    src.mkdir(parents=True)
    (src / "w.bin").write_bytes(data)
    Drainer(store).drain(src, build_manifest(src, step, 0, 1, created=1.0),
                         journal_path=tmp_path / f"j-{step}")


def _cfg(tmp_path: Path, **env: str) -> config.AgentConfig:
    return agent_config(tmp_path, **env)


class StopsMidFetch:
    """The real store; the first ranged read of the fetch stops the server
    first, and says which read that was (`via`)."""

    def __init__(self, inner: Any, server: S3Server) -> None:
        self.inner, self.server, self.via = inner, server, ""

    def _stop_first(self, via: str) -> None:
        if not self.via:
            self.via = via
            self.server.stop()

    def get_range_into(self, key: str, start: int, buffer: memoryview) -> int:
        self._stop_first("get_range_into")
        return int(self.inner.get_range_into(key, start, buffer))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class StopsMidSplicedFetch(StopsMidFetch):
    """The same, where the fetch has the store write ranges into the files
    (a plain HTTP endpoint into memory: spliced from the socket)."""

    def get_range_to_file(self, key: str, start: int, length: int, fd: int, offset: int) -> int:
        self._stop_first("get_range_to_file")
        return int(self.inner.get_range_to_file(key, start, length, fd, offset))


class StopsMidDirectFetch(StopsMidFetch):
    """The same, where whole parts are read through a buffer and written by
    direct I/O (onto a disk)."""

    def get_range_through(self, *args: Any) -> int:
        self._stop_first("get_range_through")
        return int(self.inner.get_range_through(*args))


#: Each wrapper, the read it stops at, and where the work directory is: on
#: the disk (direct I/O), on the disk with restore.directIO false (the page
#: cache), or in memory (tmpfs: spliced).
WAYS = [(StopsMidFetch, "get_range_into", "disk"),
        (StopsMidFetch, "get_range_into", "disk, page cache"),
        (StopsMidSplicedFetch, "get_range_to_file", "memory"),
        (StopsMidDirectFetch, "get_range_through", "disk")]


@pytest.mark.parametrize(("wrapper", "via", "where"), WAYS)
def test_a_store_stopped_mid_fetch_and_started_again_restores_the_newest_step(
        server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        wrapper: type[StopsMidFetch], via: str, where: str) -> None:
    if where == "disk" and not direct_io.worthwhile(tmp_path):
        pytest.skip(f"{tmp_path} is not on a local disk")
    opened: list[Path] = []  # files opened for direct I/O

    class Counted(direct_io.DirectFile):
        def __init__(self, path: Path) -> None:
            opened.append(path)
            super().__init__(path)

    monkeypatch.setattr(direct_io, "DirectFile", Counted)
    asked: list[bool] = []  # what each fetch was told of direct I/O
    real_choose = range_fetch.choose

    def choose(store: Any, staging: Path, direct: bool = True) -> str:
        asked.append(direct)
        return real_choose(store, staging, direct)

    monkeypatch.setattr(range_fetch, "choose", choose)
    bucket, prefix = server.create_bucket(), f"t-{uuid.uuid4().hex[:8]}"
    real = server.open_store(bucket, prefix, max_attempts=1)
    newest = os.urandom(SIZE)
    _push(tmp_path, real, 7, newest)
    # An older step on this node's local tier: the tempting wrong answer.
    old = tmp_path / "old"
    old.mkdir()
    (old / "w.bin").write_bytes(b"older step" * 100)
    LocalTier(tmp_path / "local").capture(old, 6, writer=0, writers=1)
    store = wrapper(real, server)
    waits: list[float] = []

    def sleep(seconds: float) -> None:  # the back-off: the store comes back meanwhile
        waits.append(seconds)
        if len(waits) == 1:
            restart(server, bucket)

    with contextlib.ExitStack() as stack:
        work = tmp_path / "work"
        if where == "memory":
            shm = Path("/dev/shm")
            if not shm.is_dir() or direct_io.filesystem_of(
                    shm, direct_io.MOUNTINFO.read_text(), os.stat(shm).st_dev) != "tmpfs":
                pytest.skip("no tmpfs at /dev/shm")
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=shm)))
        env = {"CKPTDRAIN_WORK_DIR": str(work)}
        if where == "disk, page cache":
            env["CKPTDRAIN_RESTORE_DIRECT_IO"] = "false"
        result, code = command.restore_with_retries(
            _cfg(tmp_path, **env), lambda cfg: (store, None),
            sleep=sleep, rng=random.Random(1))
        assert store.via == via and len(waits) == 1
        assert (code, result.outcome, result.step, result.tier) == (0, "restored", 7, "global")
        assert result.attempts == 2
        assert (work / "step-7" / "w.bin").read_bytes() == newest
        assert not (work / "step-6").exists()
        assert bool(opened) is (where == "disk")
        assert asked and all(a is (where != "disk, page cache") for a in asked)
        # The result says how the files were written.
        io = {"disk": "direct", "disk, page cache": "buffered", "memory": "spliced"}[where]
        assert (result.io, result.direct_bytes) == (io, SIZE if io == "direct" else 0)


def _restore_process(tmp_path: Path, server: S3Server, bucket: str, prefix: str,
                     deadline: str) -> tuple[subprocess.Popen[str], Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPTDRAIN_", "AWS_"))}
    env.update(CKPTDRAIN_WORK_DIR=str(tmp_path / "work"),
               CKPTDRAIN_LOCAL_DIR=str(tmp_path / "local"),
               CKPTDRAIN_STORE_URI=f"s3://{bucket}/{prefix}",
               CKPTDRAIN_S3_ENDPOINT=server.endpoint_url, AWS_REGION=server.region,
               AWS_ACCESS_KEY_ID=server.access_key, AWS_SECRET_ACCESS_KEY=server.secret_key,
               CKPTDRAIN_RESTORE_RETRY_DEADLINE=deadline)
    log = tmp_path / "restore.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ckptdrain", "restore"], env=env,
                                stdout=out, stderr=subprocess.STDOUT, text=True)
    return proc, log


def test_the_init_step_waits_for_a_stopped_store_then_restores(
        server: S3Server, tmp_path: Path) -> None:
    bucket, prefix = server.create_bucket(), f"t-{uuid.uuid4().hex[:8]}"
    data = os.urandom(SIZE)
    _push(tmp_path, server.open_store(bucket, prefix), 3, data)
    server.stop()
    proc, log = _restore_process(tmp_path, server, bucket, prefix, "10m")
    try:
        deadline = time.monotonic() + WAIT_S
        while "trying again in" not in log.read_text():
            assert proc.poll() is None, log.read_text()  # it must wait, not fail
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        restart(server, bucket)
        assert proc.wait(WAIT_S) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    doc = json.loads((tmp_path / "work" / "restore.json").read_text())
    assert (doc["outcome"], doc["step"], doc["tier"]) == ("restored", 3, "global")
    assert doc["attempts"] >= 2
    assert (tmp_path / "work" / "step-3" / "w.bin").read_bytes() == data


def test_a_store_down_past_the_deadline_fails_the_init_step_with_the_reason(
        server: S3Server, tmp_path: Path) -> None:
    bucket, prefix = server.create_bucket(), f"t-{uuid.uuid4().hex[:8]}"
    _push(tmp_path, server.open_store(bucket, prefix), 3, os.urandom(1000))
    server.stop()
    proc, log = _restore_process(tmp_path, server, bucket, prefix, "2s")
    try:
        assert proc.wait(WAIT_S) == 3, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    doc = json.loads((tmp_path / "work" / "restore.json").read_text())
    assert (doc["outcome"], doc["fresh_start"], doc["step"]) == ("store_unavailable", False, None)
    assert "gave up after" in doc["reason"] and "restore.retryDeadline 2s" in doc["reason"]
    assert "store_unavailable" in log.read_text().splitlines()[-1]
