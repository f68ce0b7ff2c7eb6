"""`ckptdrain restore` when the work volume cannot take the checkpoint.

A restore that finds a checkpoint but cannot place it must never tell the
trainer "fresh start" (it would throw every step away): exit 1, outcome
`cannot_place`, `fresh_start: false`, and nothing half-written left behind.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.smallfs import small_filesystem

from ckptdrain import cli
from ckptdrain.node import config, space
from ckptdrain.node.localtier import LocalTier
from ckptdrain.restore.engine import restore

SIZE = 4 << 20  # the checkpoint; the work volume gets 1 MiB


def _source(tmp_path: Path, step: int) -> Path:
    src = tmp_path / "src" / f"step-{step}"
    src.mkdir(parents=True)
    (src / "w.bin").write_bytes(os.urandom(SIZE))
    return src


def _run_restore(tmp_path: Path, work: Path, **env: str) -> tuple[int, dict[str, object]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CKPTDRAIN_")}
    base.update(CKPTDRAIN_WORK_DIR=str(work), CKPTDRAIN_LOCAL_DIR=str(tmp_path / "local"),
                **env)
    proc = subprocess.run([sys.executable, "-m", "ckptdrain", "restore"], env=base,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads((work / "restore.json").read_text())


def _assert_cannot_place(code: int, doc: dict[str, object], work: Path) -> None:
    assert code == 1, doc
    assert doc["outcome"] == "cannot_place" and doc["fresh_start"] is False
    assert doc["step"] is None and "could not be written" in str(doc["reason"])
    assert sorted(os.listdir(work)) == ["restore.json"]  # nothing half-written


def test_a_local_copy_that_cannot_fit_is_not_a_fresh_start(tmp_path: Path) -> None:
    LocalTier(tmp_path / "local").capture(_source(tmp_path, 7), 7, writer=0, writers=1)
    with small_filesystem(tmp_path / "work", "1m") as work:
        code, doc = _run_restore(tmp_path, work)
        _assert_cannot_place(code, doc, work)
        assert "free" in str(doc["reason"])  # refused before copying


def test_a_global_copy_that_fills_the_disk_is_not_a_fresh_start(tmp_path: Path) -> None:
    uri = f"file://{tmp_path}/store"
    assert cli.main(["push", str(_source(tmp_path, 9)), uri, "-q", "--create"]) == 0
    with small_filesystem(tmp_path / "work", "1m") as work:
        code, doc = _run_restore(tmp_path, work, CKPTDRAIN_STORE_URI=uri)
        _assert_cannot_place(code, doc, work)  # a real ENOSPC mid-fetch


def test_no_room_without_a_small_filesystem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    LocalTier(tmp_path / "local").capture(_source(tmp_path, 3), 3, writer=0, writers=1)
    monkeypatch.setattr(space, "free_bytes", lambda path: 1024)
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    cfg = config.load(parser.parse_args([]), {"CKPTDRAIN_WORK_DIR": str(tmp_path / "work"),
                                             "CKPTDRAIN_LOCAL_DIR": str(tmp_path / "local")})
    result, code = restore(cfg, None)
    assert (code, result.outcome, result.fresh_start) == (1, "cannot_place", False)
    assert result.skipped[0].step == 3 and "free" in result.skipped[0].reason
