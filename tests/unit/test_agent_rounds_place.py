"""Where a restart in place takes the agreed step from (agent/rounds.py).

The node's local tier may hold a copy of the step number from another run
(a pod of this rank on this node before a restore went back past it). When
the ranks agreed on a step complete in the global tier, that copy is used
only when it is the committed one; else this rank would load another run's
weights beside the other ranks' committed ones.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.support.faults import FaultyStore

from ckptdrain.agent import rounds as rounds_mod
from ckptdrain.manifest import EXTRA_TIMELINE
from ckptdrain.node.localtier import LocalTier
from ckptdrain.store.local import LocalStore
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.scan import build_manifest


def _source(tmp_path: Path, name: str, content: bytes) -> Path:
    src = tmp_path / "src" / name
    src.mkdir(parents=True)
    (src / "w.bin").write_bytes(content)
    return src


def _rounds(tmp_path: Path, local: bytes, committed: bytes) -> tuple[rounds_mod.Rounds, Path]:
    """Rank 0 of 2, its node holding step 100 as `local` (run t0), the store
    step 100 of both ranks as `committed` for rank 0 (run t1)."""
    store = LocalStore(str(tmp_path / "store"))
    for writer in (0, 1):
        src = _source(tmp_path, f"commit-{writer}", committed if writer == 0 else b"rank 1" * 50)
        manifest = replace(build_manifest(src, 100, writer, 2, created=1.0),
                           extra={EXTRA_TIMELINE: "t1"})
        Drainer(store).drain(src, manifest, journal_path=tmp_path / f"j{writer}")
    tier = LocalTier(tmp_path / "local")
    tier.capture(_source(tmp_path, "node", local), 100, writer=0, writers=2,
                 extra={EXTRA_TIMELINE: "t0"})
    work = tmp_path / "work"
    work.mkdir()
    cfg = SimpleNamespace(writer=0, writers=2, pod_uid="uid-0", pod_name="llm-0",
                          node_name="node-a", work_dir=work)
    agent = SimpleNamespace(cfg=cfg, tier=tier, drain=None, keep_in_work=set(),
                            work_lock=threading.Lock(), timeline="t1", resumed=None,
                            terminating=threading.Event())
    faulty = FaultyStore(store)
    return rounds_mod.Rounds(agent, meeting=None, store=faulty), work  # type: ignore[arg-type]


def test_another_runs_copy_on_the_node_gives_way_to_the_committed_step(tmp_path: Path) -> None:
    rounds, work = _rounds(tmp_path, local=b"abandoned run" * 50, committed=b"this run" * 50)
    assert rounds._place(100, complete=[100]) == "global"
    assert (work / "step-100" / "w.bin").read_bytes() == b"this run" * 50


def test_the_nodes_copy_of_the_committed_step_is_used(tmp_path: Path) -> None:
    rounds, work = _rounds(tmp_path, local=b"this run" * 50, committed=b"this run" * 50)
    assert rounds._place(100, complete=[100]) == "local"
    assert (work / "step-100" / "w.bin").read_bytes() == b"this run" * 50


def test_a_store_that_does_not_answer_leaves_the_verified_node_copy_in_use(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Whether the node's copy is the committed one cannot be asked: the
    verified node copy serves, as it did before the check, and the log says why."""
    rounds, work = _rounds(tmp_path, local=b"this run" * 50, committed=b"this run" * 50)
    rounds.store.fail("get_bytes", times=100)
    with caplog.at_level(logging.WARNING, logger=rounds_mod.log.name):
        assert rounds._place(100, complete=[100]) == "local"
    assert (work / "step-100" / "w.bin").read_bytes() == b"this run" * 50
    assert "using the verified node copy" in caplog.text and "did not answer" in caplog.text
