"""PyTorch Distributed Checkpoint through ckptdrain, with real torch (CPU) and SeaweedFS.

Two writers save one step together (two processes, a gloo process group,
each tensor a DTensor sharded over both); each writer's step directory is
drained into the store; the step is then restored with one reader (plain
tensors, no process group) and with three (a gloo group of three, sharded
three ways): the state (model and Adam) must equal the reference, shard by
shard. A flipped byte in one data object is refused with IntegrityError and
leaves the target untouched; a local-tier copy is used when it verifies and
skipped when it does not; an async save killed after its data files but
before DCP finished leaves the previous step the newest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="ckptdrain.dcp needs PyTorch (the `torch` extra)")
pytest.importorskip("numpy", reason="DCP's object collectives need NumPy (the torch extra)")

import torch.distributed.checkpoint as torch_dcp  # noqa: E402
from tests.support.s3servers import S3Server  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

from ckptdrain import dcp as ckpt_dcp  # noqa: E402
from ckptdrain import keys  # noqa: E402
from ckptdrain.client import Client  # noqa: E402
from ckptdrain.errors import IntegrityError  # noqa: E402
from ckptdrain.node.localtier import LocalTier  # noqa: E402
from ckptdrain.node.steps import completed_steps  # noqa: E402
from ckptdrain.store.base import Store  # noqa: E402
from ckptdrain.transfer.catalog import load_checkpoint  # noqa: E402
from ckptdrain.transfer.drain import Drainer  # noqa: E402
from ckptdrain.transfer.scan import build_manifest  # noqa: E402

WORKER = Path(__file__).with_name("dcp_worker.py")
STEP = 5
WRITERS = 2
#: A bound on one rank's run (imports of torch dominate), not an assertion.
RANK_TIMEOUT = 600


@dataclass(frozen=True)
class Saved:
    work_dirs: list[Path]
    bucket: str


def _run_ranks(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, str(WORKER), json.dumps(job)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for job in jobs]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=RANK_TIMEOUT)
        assert proc.returncode == 0, f"rank failed ({proc.returncode}):\n{err[-3000:]}"
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _push(store: Store, source: Path, writer: int) -> None:
    manifest = build_manifest(source, STEP, writer, WRITERS, created=time.time())
    Drainer(store, part_size=store.min_part_size).drain(
        source, manifest, journal_path=source.parent / f".journal-{writer}",
        cancel=threading.Event())


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, seaweedfs: S3Server) -> Saved:
    root = tmp_path_factory.mktemp("dcp")
    work_dirs = [root / f"work-{w}" for w in range(WRITERS)]
    _run_ranks([{"mode": "save", "rank": w, "world": WRITERS, "init": str(root / "init"),
                 "work_dir": str(work_dirs[w]), "step": STEP} for w in range(WRITERS)])
    return Saved(work_dirs, seaweedfs.create_bucket())


@pytest.fixture
def store(saved: Saved, seaweedfs: S3Server) -> Iterator[Store]:
    """The saved step, drained into a prefix of the store that is this test's alone."""
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    store = seaweedfs.open_store(saved.bucket, prefix)
    for w, work in enumerate(saved.work_dirs):
        _push(store, work / f"step-{STEP}", w)
    yield store
    seaweedfs.delete_prefix(saved.bucket, prefix + "/")


def _store_job(seaweedfs: S3Server, store: Store, world: int, init: Path) -> list[dict[str, Any]]:
    cfg = {"endpoint": seaweedfs.endpoint_url, "region": seaweedfs.region,
           "access": seaweedfs.access_key, "secret": seaweedfs.secret_key,
           "bucket": store.bucket, "prefix": store.prefix.rstrip("/")}  # type: ignore[attr-defined]
    return [{"mode": "load", "rank": r, "world": world, "init": str(init), "store": cfg}
            for r in range(world)]


def test_each_rank_writes_its_own_writer_and_rank_0_the_metadata(saved: Saved) -> None:
    names = [sorted(p.name for p in (w / f"step-{STEP}").iterdir()) for w in saved.work_dirs]
    assert ".metadata" in names[0] and ".metadata" not in names[1], names
    assert all(n.startswith("__0_") for n in names[0] if n != ".metadata"), names
    assert names[1] and all(n.startswith("__1_") for n in names[1]), names


@pytest.mark.parametrize("readers", [1, 3])
def test_resharded_restore_equals_the_reference(
        readers: int, store: Store, seaweedfs: S3Server, tmp_path: Path) -> None:
    results = _run_ranks(_store_job(seaweedfs, store, readers, tmp_path / "init"))
    assert len(results) == readers
    for result in results:
        assert result["step"] == STEP
        assert result["keys"] > 6 and result["mismatched"] == [], result


def _zeros() -> tuple[dict[str, Any], dict[str, Any]]:
    sys.path.insert(0, str(WORKER.parent))
    try:
        from dcp_worker import reference
    finally:
        sys.path.remove(str(WORKER.parent))
    return {k: torch.zeros_like(v) for k, v in reference().items()}, reference()


@pytest.mark.parametrize(("writer_id", "suffix"), [(1, ".distcp"), (0, ".metadata")])
def test_a_flipped_byte_is_refused_and_nothing_is_loaded(
        store: Store, writer_id: int, suffix: str) -> None:
    ckpt = load_checkpoint(store, STEP)
    writer = ckpt.manifests[writer_id]
    entry = next(f for f in writer.files if f.path.endswith(suffix))
    key = keys.data_key(STEP, writer_id, entry.path, writer.attempt)
    data = bytearray(store.get_bytes(key))
    data[len(data) // 2] ^= 0x01
    store.put_bytes(key, bytes(data))
    target, _ = _zeros()
    with pytest.raises(IntegrityError, match=r"CRC32C .* does not match"):
        ckpt_dcp.load(target, store)
    assert all(not t.any() for t in target.values()), "bytes were loaded from a failed restore"


def test_the_local_tier_serves_what_verifies_and_the_store_the_rest(
        store: Store, saved: Saved, tmp_path: Path) -> None:
    tiers = {w: tmp_path / f"local-{w}" for w in range(WRITERS)}
    for w, work in enumerate(saved.work_dirs):
        LocalTier(tiers[w]).capture(work / f"step-{STEP}", STEP, writer=w, writers=WRITERS)
    spoiled = next(p for p in LocalTier(tiers[1]).data_dir(STEP).iterdir()
                   if p.name.endswith(".distcp"))
    data = bytearray(spoiled.read_bytes())
    data[0] ^= 0x01
    # A new file under the name: capture may have hard-linked the shared work dir's.
    spoiled.with_name("spoiled").write_bytes(bytes(data))
    os.replace(spoiled.with_name("spoiled"), spoiled)
    target, reference = _zeros()
    with ckpt_dcp.StoreReader(store, local=tiers) as reader:
        torch_dcp.load(target, storage_reader=reader)
        files = reader.stats.files
    assert all(torch.equal(target[k], reference[k]) for k in reference)
    assert files[spoiled.name] == "global", files
    assert {v for k, v in files.items() if k != spoiled.name} == {"local"}, files


def test_an_interrupted_async_save_leaves_the_previous_step_newest(tmp_path: Path) -> None:
    work, started = tmp_path / "work", tmp_path / "started"
    job = {"mode": "interrupt", "rank": 0, "world": 1, "work_dir": str(work),
           "step": STEP, "started": str(started)}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, str(WORKER), json.dumps(job)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + RANK_TIMEOUT  # a bound on the wait, not an assertion
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started.exists(), proc.stderr.read().decode()[-3000:] if proc.stderr else ""
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM
    assert completed_steps(work) == [STEP]
    unfinished = work / f"step-{STEP + 1}.tmp"
    assert any(p.name.endswith(".distcp") for p in unfinished.iterdir())
    assert not (unfinished / ".metadata").exists()
    assert not (work / f"step-{STEP + 1}").exists()


class _FailingWriter(torch_dcp.FileSystemWriter):  # type: ignore[misc]
    def write_data(self, plan: Any, planner: Any) -> Any:
        raise OSError(28, "No space left on device")


def test_a_failed_async_save_publishes_nothing(tmp_path: Path) -> None:
    client = Client(tmp_path / "work", environ={"CKPTDRAIN_WRITERS": "1"})
    _, reference = _zeros()
    ckpt_dcp.save(reference, client, STEP)
    future = ckpt_dcp.async_save(reference, client, STEP + 1, writer_class=_FailingWriter)
    with pytest.raises(CheckpointException) as failed:
        future.result(timeout=RANK_TIMEOUT)
    causes = [f[0] if isinstance(f, tuple) else f for f in failed.value.failures.values()]
    assert [type(c) for c in causes] == [OSError], causes
    assert completed_steps(tmp_path / "work") == [STEP]


def test_more_writers_than_ranks_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    client = Client(tmp_path / "work", environ={"CKPTDRAIN_WRITER_ID": "1",
                                               "CKPTDRAIN_WRITERS": "2"})
    with pytest.raises(ValueError,
                       match=r"CKPTDRAIN_WRITERS is 2 with 1 process\(es\) per pod but no"):
        ckpt_dcp.save({"x": torch.zeros(2)}, client, STEP)
    assert not (tmp_path / "work").exists()


def test_a_step_that_is_not_one_dcp_save_is_refused(tmp_path: Path) -> None:
    from ckptdrain.store.local import LocalStore

    store = LocalStore(tmp_path / "store")
    for w in range(WRITERS):
        source = tmp_path / f"w{w}" / f"step-{STEP}"
        source.mkdir(parents=True)
        (source / ".metadata").write_bytes(b"each rank saved alone")
        _push(store, source, w)
    with pytest.raises(IntegrityError, match=r"not a DCP checkpoint .* writers \[0, 1\]"):
        ckpt_dcp.StoreReader(store, STEP, cache_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store", "w0", "w1"]


def test_restore_hands_a_job_of_another_world_size_the_step_to_load_resharded(
        store: Store, tmp_path: Path) -> None:
    """1 rank comes back where 2 saved: the restore step neither fails nor
    needs `ckptdrain.io/restore: skip`; it names the step, and the trainer
    loop of docs/trainer-protocol.md loads it, resharded, to the reference."""
    from ckptdrain.node import config as node_config
    from ckptdrain.restore.engine import restore

    cfg = node_config.load(environ={"CKPTDRAIN_WORK_DIR": str(tmp_path / "work"),
                                    "CKPTDRAIN_LOCAL_DIR": str(tmp_path / "local"),
                                    "CKPTDRAIN_WRITER_ID": "0", "CKPTDRAIN_WRITERS": "1"})
    result, code = restore(cfg, store)
    assert (code, result.outcome, result.step, result.step_writers) == (0, "reshard", STEP,
                                                                         WRITERS)
    result.write(cfg.restore_result)
    restored = Client(cfg.work_dir).restored()
    assert restored is None  # nothing placed: the step is loaded from the store
    target, reference = _zeros()
    assert ckpt_dcp.load(target, store, restored.step if restored else None) == STEP
    assert all(torch.equal(target[k], reference[k]) for k in reference)
