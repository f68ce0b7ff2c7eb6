"""The schedule loop's decisions, driven directly (no processes, no store)."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from ckptdrain.agent.drainworker import next_backoff
from ckptdrain.agent.loop import Agent, goes_global
from ckptdrain.agent.metrics import AgentMetrics
from ckptdrain.agent.report import CheckpointEvent
from ckptdrain.client import Client
from ckptdrain.node import config
from ckptdrain.node.localtier import LocalTier


class Recorder:
    def __init__(self) -> None:
        self.events: list[CheckpointEvent] = []

    def report(self, event: CheckpointEvent) -> None:
        self.events.append(event)


def _agent(tmp_path: Path, **env: str) -> tuple[Agent, Recorder]:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    cfg = config.load(parser.parse_args([]), {
        "CKPTDRAIN_WORK_DIR": str(tmp_path / "work"),
        "CKPTDRAIN_LOCAL_DIR": str(tmp_path / "local"),
        "CKPTDRAIN_LOCAL_KEEP": "2", **env})
    recorder = Recorder()
    return Agent(cfg, LocalTier(cfg.local_dir), recorder, AgentMetrics(), None), recorder


def _publish(tmp_path: Path, step: int) -> None:
    client = Client(tmp_path / "work")
    (client.begin(step) / "w").write_bytes(bytes([step % 256]) * 1000)
    client.complete(step)


def test_every_nth_capture_goes_global_starting_with_the_first() -> None:
    assert [n for n in range(1, 8) if goes_global(n, 3)] == [1, 4, 7]
    assert all(goes_global(n, 1) for n in range(1, 5))


def test_backoff_doubles_and_is_capped() -> None:
    delays = [None]
    for _ in range(10):
        delays.append(next_backoff(delays[-1]))
    assert delays[1] == 1.0 and delays[2] == 2.0 and delays[-1] == 60.0


def test_captures_only_the_newest_published_step_and_prunes_the_work_dir(tmp_path: Path
                                                                          ) -> None:
    agent, recorder = _agent(tmp_path)
    _publish(tmp_path, 1)
    _publish(tmp_path, 2)
    (tmp_path / "work" / "step-3.tmp").mkdir()  # being written: never captured
    assert agent.capture_newest("schedule") == 2
    assert agent.tier.steps() == [2]
    assert [e.state.value for e in recorder.events] == ["Capturing", "Local"]
    assert agent.capture_newest("schedule") is None  # nothing new
    agent.housekeeping()
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["step-2", "step-3.tmp"]


def test_schedule_request_is_seen_by_the_client(tmp_path: Path) -> None:
    agent, _ = _agent(tmp_path)
    client = Client(tmp_path / "work")
    agent.request("schedule")
    assert client.checkpoint_requested() is not None
    _publish(tmp_path, 4)
    assert client.checkpoint_requested() is None
    agent.request("schedule")
    assert client.checkpoint_requested() is not None


def test_steps_newer_than_the_restored_one_are_an_abandoned_timeline(tmp_path: Path) -> None:
    agent, _ = _agent(tmp_path)
    for step in (5, 9):
        _publish(tmp_path, step)
        agent.capture_newest("schedule")
    assert agent.tier.steps() == [9, 5]
    # Restore chose 5 (say, the newest globally complete step of a multi-writer job).
    shutil.rmtree(tmp_path / "work")
    _publish(tmp_path, 5)
    result = {"fresh_start": False, "step": 5, "at": time.time()}
    (tmp_path / "work" / "restore.json").write_text(json.dumps(result))
    agent.recover()
    assert agent.tier.steps() == [5]
    _publish(tmp_path, 6)
    assert agent.capture_newest("schedule") == 6
    _publish(tmp_path, 7)
    assert agent.capture_newest("schedule") == 7
    agent.housekeeping()
    assert (tmp_path / "work" / "step-5").exists()  # the trainer may still be loading it
    # A restarted agent keeps what was captured after the restore.
    agent.recover()
    assert agent.tier.steps() == [7, 6]


def test_without_a_restore_result_nothing_is_dropped(tmp_path: Path) -> None:
    agent, _ = _agent(tmp_path)
    _publish(tmp_path, 9)
    agent.capture_newest("schedule")
    agent.recover()
    assert agent.tier.steps() == [9]


def test_sigterm_flush_without_a_store_captures_and_returns_zero(tmp_path: Path) -> None:
    agent, recorder = _agent(tmp_path, CKPTDRAIN_GRACE_SECONDS="4")
    _publish(tmp_path, 7)
    agent.on_sigterm()
    assert agent.flush() == 0
    assert agent.tier.steps() == [7]
    assert recorder.events[-1].trigger == "sigterm"
    agent.tier.verify(7)
