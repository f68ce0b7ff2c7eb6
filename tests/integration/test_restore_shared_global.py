"""A step restored from the global tier (real SeaweedFS and MinIO) by uid
65532, with the umask a careless process has, is read by a trainer of
another uid that shares the pod's group."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.asuser import CKPTDRAIN_UID, TRAINER_UID, node_dirs, run_as
from tests.support.s3servers import S3Server

from ckptdrain.client import Client
from ckptdrain.node import config
from ckptdrain.restore.engine import restore
from ckptdrain.transfer import fetch
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.scan import build_manifest

#: Loaded before the fork: a child of another uid may not read this Python's home.
_PRELOADED = (fetch,)

FILES = {"model/w.bin": os.urandom(3 << 20), "optim.bin": b"optimizer" * 3000}


@pytest.fixture
def node() -> Iterator[Path]:
    with node_dirs("ckptdrain-shared-", "node", trainer_link=True) as top:
        yield top / "node"


def test_a_global_step_restored_by_65532_is_read_by_a_trainer_of_another_uid(
        node: Path, s3server: S3Server, s3area: tuple[str, str]) -> None:
    bucket, prefix = s3area
    src = node.parent / "src"
    for name, data in FILES.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    Drainer(s3server.open_store(bucket, prefix)).drain(
        src, build_manifest(src, 12, 0, 1, created=1.0), journal_path=node.parent / "journal")
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    cfg = config.load(parser.parse_args([]), {
        "CKPTDRAIN_WORK_DIR": str(node / "work"), "CKPTDRAIN_LOCAL_DIR": str(node),
        "CKPTDRAIN_TRAINER_WORK_DIR": str(node.parent / "trainer")})

    def restore_as_ckptdrain() -> tuple[int, str, int | None, str | None, str | None]:
        result, code = restore(cfg, s3server.open_store(bucket, prefix))
        result.write(cfg.restore_result)
        return code, result.outcome, result.step, result.tier, result.path

    assert run_as(CKPTDRAIN_UID, restore_as_ckptdrain) == (
        0, "restored", 12, "global", str(node.parent / "trainer" / "step-12"))
    view = node.parent / "trainer"

    def trainer_reads() -> tuple[int, dict[str, bytes]]:
        found = Client(view, restore_result=view / "restore.json", environ={}).restored()
        assert found is not None, "the trainer found no restored step"
        return found.step, {str(p.relative_to(found.path)): p.read_bytes()
                            for p in sorted(found.path.rglob("*")) if p.is_file()}

    assert run_as(TRAINER_UID, trainer_reads) == (12, FILES)
