"""Restored steps belong to the pod's group, whoever restored them and
whoever trains: restore (uid 65532) empties the work dir a previous pod
left, places the step readable by a trainer of another uid, and names it as
the trainer sees it. Real files, real users (forked children, tests/support/asuser.py)."""

from __future__ import annotations

import argparse
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.asuser import CKPTDRAIN_UID, GROUP, TRAINER_UID, node_dirs, run_as

from ckptdrain import group_access
from ckptdrain.client import Client
from ckptdrain.errors import InvalidInput
from ckptdrain.node import config
from ckptdrain.node.localtier import LocalTier
from ckptdrain.restore import workdir
from ckptdrain.restore.engine import restore, skip
from ckptdrain.store.local import LocalStore
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.fetch import fetch
from ckptdrain.transfer.scan import build_manifest

FILES = {"model/w.bin": b"weights" * 5000, "optim.bin": b"optimizer" * 3000}


@pytest.fixture
def node() -> Iterator[Path]:
    """A node's hostPath as the prepare container leaves it: the local tier's
    root, and the work dir inside it, owned by 65532 and the pod's group."""
    with node_dirs("ckptdrain-shared-", "node", trainer_link=True) as top:
        yield top / "node"


def _cfg(root: Path, **env: str) -> config.AgentConfig:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.load(parser.parse_args([]), {
        "CKPTDRAIN_WORK_DIR": str(root / "work"), "CKPTDRAIN_LOCAL_DIR": str(root),
        "CKPTDRAIN_TRAINER_WORK_DIR": str(root.parent / "trainer"), **env})


def _source(where: Path) -> Path:
    for name, data in FILES.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_bytes(data)
    return where


def _chown_tree(root: Path, uid: int) -> None:
    for current, dirs, files in os.walk(root):
        for name in (".", *dirs, *files):
            os.lchown(Path(current) / name, uid, GROUP)


def _previous_pod(work: Path) -> Path:
    """What a root trainer and the agent of a previous pod left in the work
    dir, shared as group_access makes it; and a file outside it that a
    symlink in it points to. Returns that file."""
    old = os.umask(0o022)
    try:
        group_access.make_dir(work / "step-9")
        step = group_access.make_dir(work / "step-9" / "sub")
        (step / "shard").write_bytes(b"old")
        group_access.share(step / "shard")
        group_access.make_dir(work / "step-10.tmp")
        control = group_access.make_dir(work / ".ckptdrain")
        (control / "request").write_text('{"seq": 4}')
        group_access.share(control / "request")
        (work / "restore.json").write_text('{"step": 9, "path": "/elsewhere"}')
        outside = work.parent.parent / "outside"
        outside.write_bytes(b"not the work dir's")
        (work / "escape").symlink_to(outside)
    finally:
        os.umask(old)
    _chown_tree(work / "step-9", 0)
    _chown_tree(work / ".ckptdrain", 0)
    return outside


def _read_all(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _restore_as_ckptdrain(cfg: config.AgentConfig, store: object = None
                          ) -> tuple[int, str, int | None, str | None, str | None, str | None]:
    def work() -> tuple[int, str, int | None, str | None, str | None, str | None]:
        opened = store() if callable(store) else store
        result, code = restore(cfg, opened)  # type: ignore[arg-type]
        result.write(cfg.restore_result)
        return code, result.outcome, result.step, result.tier, result.name, result.path
    return run_as(CKPTDRAIN_UID, work)


def _trainer_reads(root: Path) -> tuple[int, str, dict[str, bytes]]:
    """What a uid-1000 trainer of the group gets from the client in its own view."""
    view = root.parent / "trainer"

    def work() -> tuple[int, str, dict[str, bytes]]:
        found = Client(view, restore_result=view / "restore.json", environ={}).restored()
        assert found is not None, "the trainer found no restored step"
        return found.step, str(found.path), _read_all(found.path)
    return run_as(TRAINER_UID, work)


def test_a_local_step_restored_by_65532_is_read_by_a_trainer_of_another_uid(node: Path
                                                                            ) -> None:
    LocalTier(node).capture(_source(node.parent / "src"), 7, writer=0, writers=1)
    _chown_tree(node / "step-7", CKPTDRAIN_UID)
    outside = _previous_pod(node / "work")
    view = node.parent / "trainer"
    assert _restore_as_ckptdrain(_cfg(node)) == (
        0, "restored", 7, "local", "step-7", str(view / "step-7"))
    # Only this pod's start is left: the old steps, control files and result are gone,
    # the symlink removed and not followed.
    assert sorted(os.listdir(node / "work")) == ["restore.json", "step-7"]
    assert outside.read_bytes() == b"not the work dir's"
    step, path, files = _trainer_reads(node)
    assert (step, path) == (7, str(view / "step-7"))
    assert files == FILES
    for p in (node / "work" / "step-7").rglob("*"):
        want = group_access.DIR_MODE if p.is_dir() else group_access.FILE_MODE
        assert stat.S_IMODE(p.stat().st_mode) == want, p


def test_a_step_the_group_cannot_remove_stops_restore_naming_it(node: Path) -> None:
    stuck = node / "work" / "step-9"
    stuck.mkdir()
    (stuck / "shard").write_bytes(b"root's, in a directory only root may write")
    os.chmod(stuck, 0o755)  # a trainer that did not share its step
    (node / "work" / "step-8").mkdir()
    os.chown(node / "work" / "step-8", TRAINER_UID, TRAINER_UID)
    code, outcome, step, *_ = _restore_as_ckptdrain(_cfg(node))
    assert (code, outcome, step) == (1, "cannot_place", None)
    result = (node / "work" / "restore.json").read_text()
    assert str(stuck / "shard") in result and "Permission denied" in result
    assert not (node / "work" / "step-8").exists()  # what could go went


def test_a_deliberate_fresh_start_empties_the_work_dir_too(node: Path) -> None:
    _previous_pod(node / "work")
    cfg = _cfg(node, CKPTDRAIN_RESTORE_MODE="skip")
    outcome = run_as(CKPTDRAIN_UID, lambda: skip(cfg).outcome)
    assert outcome == "fresh_start"
    assert os.listdir(node / "work") == []


def test_restore_never_empties_a_work_dir_that_holds_the_local_tier(tmp_path: Path) -> None:
    (tmp_path / "step-3").mkdir()
    with pytest.raises(InvalidInput, match="CKPTDRAIN_WORK_DIR"):
        workdir.empty(tmp_path, keep_out=(tmp_path / "local",))
    with pytest.raises(InvalidInput, match="CKPTDRAIN_WORK_DIR"):
        workdir.empty(tmp_path, keep_out=(tmp_path,))
    assert (tmp_path / "step-3").is_dir()


def test_a_pull_by_65532_is_read_by_a_trainer_of_another_uid(node: Path) -> None:
    store_root = node.parent / "store"
    store = LocalStore(store_root)
    for writer in (0, 1):
        src = _source(node.parent / f"src-{writer}")
        Drainer(store).drain(src, build_manifest(src, 5, writer, 2, created=1.0),
                             journal_path=node.parent / f"journal-{writer}")
    dest = node / "work" / "pulled"
    run_as(CKPTDRAIN_UID, lambda: fetch(LocalStore(store_root), dest).step)
    got = run_as(TRAINER_UID, lambda: _read_all(dest))
    assert got == {f"{w}/{name}": data for w in (0, 1) for name, data in FILES.items()}
