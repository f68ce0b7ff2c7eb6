"""The restore init step (`ckptdrain restore`, a real process) against real
SeaweedFS and MinIO, for readers and for a job at another world size:

- 2 writers and 2 readers (data-parallel replica 1): each reader restores
  what the writer of its shard saved, from the store, or from that writer's
  copy on its node (read-only) when it is the committed one; never a step
  only some writers finished;
- the job comes back with 1 writer or 3: the newest step (saved by 2) is
  handed to the trainer with outcome `reshard` (a DCP checkpoint; any format
  with CKPTDRAIN_RESTORE_RESHARD=trainer), and the trainer gets every
  writer's shard from the store; a checkpoint that is not DCP, without the
  trainer's say-so, stops restore (exit 4) with the reason, and never settles
  for an older step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.support.s3servers import S3Server

from ckptdrain.node.localtier import LocalTier
from ckptdrain.store.s3 import S3Store
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.fetch import fetch
from ckptdrain.transfer.scan import build_manifest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SHARD = 3 << 20  # several parts per file on the slowest path


def _shard(writer: int, step: int) -> bytes:
    return bytes([writer, step % 256]) * (SHARD // 2)


def _source(tmp_path: Path, step: int, writer: int, writers: int, dcp: bool = False) -> Path:
    """A writer's published step, as the trainer leaves it in its work dir."""
    src = tmp_path / "src" / f"{step}-{writer}-{writers}"
    if src.is_dir():
        return src
    src.mkdir(parents=True)
    name = f"__{writer}_0.distcp" if dcp else "shard.bin"
    (src / name).write_bytes(_shard(writer, step))
    if dcp and writer == 0:
        (src / ".metadata").write_bytes(b"the coordinator's plan of every rank's chunks")
    return src


def _push(tmp_path: Path, store: S3Store, step: int, writer: int, writers: int,
          dcp: bool = False) -> None:
    src = _source(tmp_path, step, writer, writers, dcp)
    Drainer(store, part_size=5 << 20).drain(
        src, build_manifest(src, step, writer, writers, created=1000.0 + step),
        journal_path=tmp_path / f"j-{step}-{writer}-{writers}")


def _restore(tmp_path: Path, server: S3Server, area: tuple[str, str], pod: str, writer: int,
             writers: int, **env: str) -> tuple[int, dict[str, Any], str, Path]:
    """Run `ckptdrain restore` as the webhook configures it; (exit, result, stderr, work)."""
    work, bucket = tmp_path / pod / "work", area[0]
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CKPTDRAIN_"))},
        "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO)]),
        "CKPTDRAIN_STORE_URI": f"s3://{bucket}/{area[1]}",
        "CKPTDRAIN_S3_ENDPOINT": server.endpoint_url, "AWS_REGION": server.region,
        "AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key,
        "CKPTDRAIN_WORK_DIR": str(work),
        "CKPTDRAIN_LOCAL_DIR": env.pop("CKPTDRAIN_LOCAL_DIR", str(tmp_path / pod / "local")),
        "CKPTDRAIN_WRITER_ID": str(writer), "CKPTDRAIN_WRITERS": str(writers),
        "CKPTDRAIN_RESTORE_RETRY_DEADLINE": "0", **env}
    if server.ca_bundle is not None:
        environ["CKPTDRAIN_S3_CA_BUNDLE"] = str(server.ca_bundle)
    done = subprocess.run([sys.executable, "-m", "ckptdrain", "restore"], env=environ,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    result = json.loads((work / "restore.json").read_text())
    return done.returncode, result, done.stderr + done.stdout, work


@pytest.fixture
def store(s3server: S3Server, s3area: tuple[str, str]) -> S3Store:
    return s3server.open_store(*s3area)


def test_each_reader_restores_what_the_writer_of_its_shard_saved(
        tmp_path: Path, s3server: S3Server, s3area: tuple[str, str], store: S3Store) -> None:
    for writer in (0, 1):
        _push(tmp_path, store, 100, writer, 2)
    _push(tmp_path, store, 110, 0, 2)  # writer 1 never finished step 110
    # Pod 3 reads shard 1 on the node where writer 1 ran: its copy is there.
    node = tmp_path / "node" / "writer-1"
    LocalTier(node).capture(_source(tmp_path, 100, 1, 2), 100, writer=1, writers=2)
    os.chmod(node, 0o555)  # the reader's mount is read-only
    try:
        for pod, shard, local in (("pod-2", 0, None), ("pod-3", 1, str(node))):
            extra = {"CKPTDRAIN_LOCAL_DIR": local} if local else {}
            code, result, said, work = _restore(tmp_path, s3server, s3area, pod, shard, 2,
                                                CKPTDRAIN_ROLE="reader", **extra)
            assert code == 0, said
            assert (result["outcome"], result["step"]) == ("restored", 100)
            assert result["tier"] == ("local" if local else "global")
            placed = work / "step-100" / "shard.bin"
            assert placed.read_bytes() == _shard(shard, 100), said
    finally:
        os.chmod(node, 0o755)


def test_a_job_at_another_world_size_gets_the_newest_step_resharded(
        tmp_path: Path, s3server: S3Server, s3area: tuple[str, str], store: S3Store) -> None:
    _push(tmp_path, store, 90, 0, 1, dcp=True)  # older, at the new count: never chosen
    for writer in (0, 1):
        _push(tmp_path, store, 100, writer, 2, dcp=True)
    for writers in (1, 3):
        for rank in range(writers):
            code, result, said, work = _restore(tmp_path, s3server, s3area,
                                                f"w{writers}-{rank}", rank, writers)
            assert code == 0, said
            assert (result["outcome"], result["fresh_start"], result["step"],
                    result["step_writers"]) == ("reshard", False, 100, 2), said
            assert "loads it resharded" in said
            assert sorted(os.listdir(work)) == ["restore.json"]  # nothing placed


def test_another_format_is_handed_over_only_when_the_trainer_reshards(
        tmp_path: Path, s3server: S3Server, s3area: tuple[str, str], store: S3Store) -> None:
    _push(tmp_path, store, 90, 0, 1)
    for writer in (0, 1):
        _push(tmp_path, store, 100, writer, 2)
    code, result, said, work = _restore(tmp_path, s3server, s3area, "plain", 0, 1)
    assert code == 4, said
    assert (result["outcome"], result["fresh_start"], result["step"]) == (
        "none_verified", False, None)
    assert "not a DCP checkpoint" in said and "spec.restore.reshard: Trainer" in said
    assert not (work / "step-90").exists()
    code, result, said, work = _restore(tmp_path, s3server, s3area, "own", 0, 1,
                                        CKPTDRAIN_RESTORE_RESHARD="trainer")
    assert code == 0, said
    assert (result["outcome"], result["step"], result["step_writers"]) == ("reshard", 100, 2)
    # What the trainer then does: every old writer's shard, verified, from the store.
    for writer in range(result["step_writers"]):
        got = fetch(store, work / "old" / str(writer), step=result["step"], writer=writer)
        assert got.step == 100
        assert (work / "old" / str(writer) / "shard.bin").read_bytes() == _shard(writer, 100)
