"""Restore against a real store: what the store holds decides between a
restore, a fresh start and a refusal (restore/engine.py)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ckptdrain import keys
from ckptdrain.node import config
from ckptdrain.node.localtier import LocalTier
from ckptdrain.restore.engine import restore
from ckptdrain.restore.plan import Candidate, candidates, wrong_writers
from ckptdrain.store.local import LocalStore
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.scan import build_manifest


def _cfg(tmp_path: Path, writer: int, writers: int) -> config.AgentConfig:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return config.load(parser.parse_args([]), {
        "CKPTDRAIN_WORK_DIR": str(tmp_path / "work"),
        "CKPTDRAIN_LOCAL_DIR": str(tmp_path / "local"),
        "CKPTDRAIN_WRITER_ID": str(writer), "CKPTDRAIN_WRITERS": str(writers)})


def _source(tmp_path: Path, name: str, content: bytes) -> Path:
    src = tmp_path / "src" / name
    src.mkdir(parents=True)
    (src / "w.bin").write_bytes(content)
    return src


def _push(tmp_path: Path, store: LocalStore, step: int, writer: int, writers: int,
          content: bytes) -> None:
    src = _source(tmp_path, f"push-{step}-{writer}", content)
    Drainer(store).drain(src, build_manifest(src, step, writer, writers, created=1.0),
                         journal_path=tmp_path / f"j-{step}-{writer}")


def test_a_step_with_an_unreadable_manifest_is_not_a_fresh_start(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    for w in (0, 1):
        _push(tmp_path, store, 100, w, 2, bytes([w]) * 1000)
    store.put_bytes(keys.manifest_key(100, 1), b"{garbage")
    result, code = restore(_cfg(tmp_path, 0, 2), store)
    assert (code, result.outcome, result.fresh_start) == (4, "none_verified", False)
    assert [(s.step, s.tier) for s in result.skipped] == [(100, "global")]
    assert "writer 1's manifest is invalid" in result.skipped[0].reason
    assert "writer 1" in result.reason


def test_a_step_still_being_written_does_not_block_a_fresh_start(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    _push(tmp_path, store, 100, 1, 2, b"x" * 1000)  # writer 0 has not committed yet
    result, code = restore(_cfg(tmp_path, 1, 2), store)
    assert (code, result.outcome, result.fresh_start) == (0, "fresh_start", True)
    assert [(s.step, s.tier) for s in result.skipped] == [(100, "global")]
    assert "manifest is missing" in result.skipped[0].reason


def test_a_checkpoint_of_another_writer_count_that_is_not_dcp_is_refused(
        tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    for w in (0, 1):
        _push(tmp_path, store, 100, w, 2, bytes([w]) * 1000)
    _push(tmp_path, store, 90, 0, 1, b"older, but this job's count" * 10)
    result, code = restore(_cfg(tmp_path, 0, 1), store)
    # Never the older step of the right count: that throws training away.
    assert (code, result.outcome, result.fresh_start, result.step) == (
        4, "none_verified", False, None)
    assert [(s.step, s.tier) for s in result.skipped] == [(100, "global")]
    assert "has 2 writer(s), this job has 1" in result.skipped[0].reason
    assert "not a DCP checkpoint" in result.reason
    assert "spec.restore.reshard: Trainer" in result.reason
    assert not (tmp_path / "work" / "step-100").exists()
    assert not (tmp_path / "work" / "step-90").exists()


def test_plan_leaves_out_steps_of_another_writer_count() -> None:
    counts = {("local", 7): 1, ("global", 7): 2, ("global", 5): 1}
    assert candidates([7], [7, 5], writers=1, counts=counts) == [
        Candidate(7, "local"), Candidate(5, "global")]
    assert wrong_writers(counts, 1) == [Candidate(7, "global")]


def test_a_local_copy_from_another_timeline_is_not_restored(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    for w in (0, 1):
        _push(tmp_path, store, 100, w, 2, b"COMMITTED" * 100)
    # Another pod that had rank 0 left its own step 100 on this node.
    LocalTier(tmp_path / "local").capture(_source(tmp_path, "other", b"OTHER" * 100), 100,
                                          writer=0, writers=2)
    result, code = restore(_cfg(tmp_path, 0, 2), store)
    assert (code, result.step, result.tier) == (0, 100, "global")
    assert [(s.step, s.tier) for s in result.skipped] == [(100, "local")]
    assert "differs from" in result.skipped[0].reason
    assert (tmp_path / "work" / "step-100" / "w.bin").read_bytes() == b"COMMITTED" * 100


def test_a_local_copy_matching_the_global_commit_is_used(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    for w in (0, 1):
        _push(tmp_path, store, 100, w, 2, bytes([w]) * 1000)
    LocalTier(tmp_path / "local").capture(_source(tmp_path, "same", b"\x00" * 1000), 100,
                                          writer=0, writers=2)
    result, code = restore(_cfg(tmp_path, 0, 2), store)
    assert (code, result.step, result.tier, result.skipped) == (0, 100, "local", [])


def test_restore_removes_what_a_killed_restore_left(tmp_path: Path) -> None:
    # A restarted container's restore may have the PID its predecessor had.
    work = tmp_path / "work"
    pid = os.getpid()
    left = [work / f".restore-step-100-{pid}",
            work / f"..restore-step-100-{pid}.ckptdrain-{pid}-abcd",
            work / f".restore-old-step-90-{pid}"]
    for d in left:
        (d / "part").mkdir(parents=True)
    result, code = restore(_cfg(tmp_path, 0, 1), LocalStore(tmp_path / "store"))
    assert (code, result.outcome) == (0, "fresh_start")
    assert sorted(os.listdir(work)) == []


def test_the_global_fetch_checks_the_writer_count_itself(tmp_path: Path) -> None:
    # The plan is made from one listing; the fetch reads the step again.
    import pytest

    from ckptdrain.errors import IntegrityError
    from ckptdrain.restore.engine import _from_global

    store = LocalStore(tmp_path / "store")
    for w in (0, 1):
        _push(tmp_path, store, 100, w, 2, bytes([w]) * 1000)
    with pytest.raises(IntegrityError, match="has 2 writer"):
        _from_global(store, 100, 0, 1, tmp_path / "tmp")
    assert not (tmp_path / "tmp").exists()
