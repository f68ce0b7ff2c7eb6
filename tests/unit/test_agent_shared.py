"""The agent (uid 65532) and a trainer of another uid share the work dir
through the pod's group: its control files are the group's, and a step it
cannot prune is counted and named, not silently left to fill the disk."""

from __future__ import annotations

import argparse
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.asuser import CKPTDRAIN_UID, TRAINER_UID, node_dirs, run_as

from ckptdrain import group_access
from ckptdrain.agent.loop import Agent
from ckptdrain.agent.metrics import AgentMetrics
from ckptdrain.client import CONTROL_DIR, REQUEST_FILE
from ckptdrain.node import config
from ckptdrain.node.localtier import LocalTier


class _Quiet:
    def report(self, event: object) -> None:
        pass


@pytest.fixture
def root() -> Iterator[Path]:
    with node_dirs("ckptdrain-agent-", "local") as top:
        yield top


def _agent(top: Path) -> Agent:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    cfg = config.load(parser.parse_args([]), {
        "CKPTDRAIN_WORK_DIR": str(top / "local" / "work"),
        "CKPTDRAIN_LOCAL_DIR": str(top / "local"), "CKPTDRAIN_LOCAL_KEEP": "2"})
    return Agent(cfg, LocalTier(cfg.local_dir), _Quiet(), AgentMetrics(), None)  # type: ignore[arg-type]


def _publish_as_root(work: Path, step: int, shared: bool) -> None:
    """A root trainer's step; `shared` as group_access makes it, else with
    root's default modes (a directory only root may write)."""
    final = work / f"step-{step}"
    final.mkdir(mode=0o755)
    (final / "w.bin").write_bytes(bytes([step]) * 1000)
    if shared:
        group_access.share_tree(final)


def test_a_step_the_agent_cannot_prune_is_counted_and_logged_once(root: Path) -> None:
    work = root / "local" / "work"
    _publish_as_root(work, 1, shared=False)
    _publish_as_root(work, 2, shared=True)

    def agent_run() -> tuple[float, list[str], list[str]]:
        records: list[str] = []

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                records.append(record.getMessage())

        logging.getLogger("ckptdrain.agent.loop").addHandler(Keep())
        agent = _agent(root)
        # The local tier holds step 2 (newest); step 1 in the work dir is superseded.
        assert agent.capture_newest("schedule") == 2
        for _ in range(3):
            agent.prune_work_dir()
        count = agent.metrics.errors.labels("prune")._value.get()
        return count, records, sorted(os.listdir(work))

    count, records, left = run_as(CKPTDRAIN_UID, agent_run)
    assert count == 1
    warned = [r for r in records if "cannot remove step 1" in r]
    assert len(warned) == 1 and "Permission denied" in warned[0] and "errno 13" in warned[0]
    assert str(work) in warned[0]
    # Step 1 was moved out of the trainer's way; step 2 (the newest) stays.
    assert "step-1" not in left and "step-2" in left
    assert [n for n in left if n.startswith(".prune-step-1-")]


def test_the_agents_control_files_let_a_trainer_of_another_uid_answer(root: Path) -> None:
    work = root / "local" / "work"
    run_as(CKPTDRAIN_UID, lambda: _agent(root).request("schedule"))
    control = work / CONTROL_DIR
    assert stat.S_IMODE(control.stat().st_mode) == group_access.DIR_MODE
    assert stat.S_IMODE((control / REQUEST_FILE).stat().st_mode) == group_access.FILE_MODE

    def trainer_acks() -> str:
        (control / "ack").write_text('{"seq": 1}')
        return (control / REQUEST_FILE).read_text()
    assert '"reason": "schedule"' in run_as(TRAINER_UID, trainer_acks)
