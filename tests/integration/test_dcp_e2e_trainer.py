"""The e2e DCP step's trainer (e2e/images/trainer/train_dcp.py) as processes.

Two ranks (a gloo group through a rendezvous file) train, save one step with
ckptdrain.dcp, and are killed; each writer's directory is drained into
SeaweedFS; then the trainer comes back as one rank and as three, and each
loads that step, resharded, with the state hash the two ranks saved: what
the cluster step asserts, without the cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tests.support.s3servers import S3Server

from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.scan import build_manifest

pytest.importorskip("torch", reason="the trainer needs PyTorch (the `torch` extra)")
pytest.importorskip("numpy", reason="DCP's object collectives need NumPy (the torch extra)")

TRAINER = Path(__file__).resolve().parents[2] / "e2e" / "images" / "trainer" / "train_dcp.py"
SAVE_AT = 3
#: A bound on the wait for the ranks' events (torch imports dominate), not an assertion.
WAIT_CAP = 300.0


def _events(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def _run(root: Path, world: int, env: dict[str, str], until: str) -> list[list[dict[str, Any]]]:
    """`world` ranks of the trainer until each printed an `until` event, then killed."""
    procs, logs = [], []
    for rank in range(world):
        logs.append(root / f"rank-{world}-{rank}.log")
        rank_env = {**env, "CKPTDRAIN_WORK_DIR": str(root / f"work-{world}-{rank}"),
                    "CKPTDRAIN_WRITER_ID": str(rank), "CKPTDRAIN_WRITERS": str(world),
                    "TRAIN_RDV": str(root / f"rdv-{world}")}
        with open(logs[-1], "wb") as out:
            procs.append(subprocess.Popen([sys.executable, str(TRAINER)], env=rank_env,
                                          stdout=out, stderr=subprocess.STDOUT))
    try:
        deadline = time.monotonic() + WAIT_CAP
        while time.monotonic() < deadline and not all(
                any(e["event"] == until for e in _events(log)) for log in logs):
            assert all(p.poll() is None for p in procs), "\n".join(
                log.read_text()[-2000:] for log in logs)
            time.sleep(0.2)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return [_events(log) for log in logs]


def test_two_ranks_save_and_one_or_three_resume_with_the_same_state(
        seaweedfs: S3Server, tmp_path: Path) -> None:
    bucket = seaweedfs.create_bucket()
    store = seaweedfs.open_store(bucket, "dcp")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONUNBUFFERED": "1",
           "TRAIN_SAVE_AT": str(SAVE_AT), "TRAIN_STEP_SECONDS": "0.05",
           "CKPTDRAIN_STORE_URI": f"s3://{bucket}/dcp",
           "CKPTDRAIN_S3_ENDPOINT": seaweedfs.endpoint_url, "AWS_REGION": seaweedfs.region,
           "AWS_ACCESS_KEY_ID": seaweedfs.access_key,
           "AWS_SECRET_ACCESS_KEY": seaweedfs.secret_key}
    saved = _run(tmp_path, 2, env, "save")
    hashes = {e["hash"] for events in saved for e in events if e["event"] == "save"}
    assert len(hashes) == 1, saved
    assert all(any(e["event"] == "fresh" for e in events) for events in saved)
    for writer in range(2):
        source = tmp_path / f"work-2-{writer}" / f"step-{SAVE_AT}"
        manifest = build_manifest(source, SAVE_AT, writer, 2, created=time.time())
        Drainer(store, part_size=store.min_part_size).drain(
            source, manifest, journal_path=tmp_path / f"journal-{writer}",
            cancel=threading.Event())
    for world in (1, 3):
        loads = [next(e for e in events if e["event"] == "load")
                 for events in _run(tmp_path, world, env, "load")]
        assert [(e["step"], e["hash"]) for e in loads] == [(SAVE_AT, *hashes)] * world
    seaweedfs.delete_bucket(bucket)
