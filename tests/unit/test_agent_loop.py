"""The schedule loop's decisions, driven directly (no processes, no store)."""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from tests.support.smallfs import small_filesystem, used_bytes

from ckptdrain.agent.drainworker import next_backoff
from ckptdrain.agent.loop import Agent
from ckptdrain.agent.metrics import AgentMetrics
from ckptdrain.agent.report import CheckpointEvent, State
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
    # (.ckptdrain is the control channel: the client's progress file lives there)
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == [
        ".ckptdrain", "step-2", "step-3.tmp"]


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


# -- a local tier that is full ---------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _ticking(agent: Agent, clock: FakeClock, seconds: float) -> list[float]:
    """Tick the loop every POLL of fake time; return when captures were attempted."""
    attempts: list[float] = []
    real = agent.capture_newest

    def counted(*args: Any, **kwargs: Any) -> int | None:
        attempts.append(clock.now)
        return real(*args, **kwargs)

    agent.capture_newest = counted  # type: ignore[method-assign]
    end = clock.now + seconds
    while clock.now < end:
        agent.tick()
        clock.now += 0.2
    return attempts


def _states(recorder: Recorder) -> list[str]:
    return [e.state.value for e in recorder.events]


def test_a_capture_that_cannot_fit_is_refused_before_writing(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "local", "8m") as local:
        agent, recorder = _agent(tmp_path, CKPTDRAIN_LOCAL_DIR=str(local))
        clock = FakeClock()
        agent.clock = clock
        step = Client(tmp_path / "work").begin(3)
        with open(step / "big", "wb") as f:
            f.truncate(32 << 20)  # 32 MiB (sparse here; the copy would write every byte)
        Client(tmp_path / "work").complete(3)
        before = used_bytes(local)
        attempts = _ticking(agent, clock, 10.0)
        assert used_bytes(local) == before  # not one block written
        assert os.listdir(local) == []
        # Back-off 1, 2, 4 s: attempts at 0, 1, 3, 7 s, not every 0.2 s.
        assert [round(t - attempts[0], 1) for t in attempts] == [0.0, 1.0, 3.0, 7.0]
        assert _states(recorder) == ["Capturing", "Failed"]
        assert "free" in recorder.events[-1].message


class FullDiskTier(LocalTier):
    """The real tier, but every capture fails as a full disk does, until `full` is cleared."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.full = True
        self.calls = 0

    def capture(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.root))
        return super().capture(*args, **kwargs)


def test_a_failing_capture_backs_off_reports_once_and_recovers(tmp_path: Path) -> None:
    agent, recorder = _agent(tmp_path, CKPTDRAIN_INTERVAL="1h")
    agent.tier = tier = FullDiskTier(agent.tier.root)
    clock = FakeClock()
    agent.clock = clock
    _publish(tmp_path, 1)
    _ticking(agent, clock, 300.0)
    # Tries at 0, 1, 3, 7, 15, 31, 63 s, then every 60 s (the cap): 10 in 5 minutes,
    # where a retry every 0.2 s made 1500.
    assert tier.calls == 10
    assert _states(recorder) == ["Capturing", "Failed"]
    # A newer step would not fit a full tier either: it waits for the back-off,
    # and the same failure is not reported again (a trainer publishing every few
    # seconds made a Failed event each time).
    _publish(tmp_path, 2)
    _ticking(agent, clock, 0.2)
    assert tier.calls == 10
    _ticking(agent, clock, 60.0)
    assert tier.calls == 11
    assert _states(recorder) == ["Capturing", "Failed"]
    tier.full = False  # space freed: the next retry succeeds and the back-off resets
    _ticking(agent, clock, 60.0)
    assert tier.steps() == [2]
    assert _states(recorder)[-1] == State.LOCAL.value


def test_after_a_bad_step_a_newer_one_is_tried_at_once(tmp_path: Path) -> None:
    agent, recorder = _agent(tmp_path, CKPTDRAIN_INTERVAL="1h")
    clock = FakeClock()
    agent.clock = clock
    _publish(tmp_path, 1)
    (tmp_path / "work" / "step-1" / "link").symlink_to("/etc/hostname")
    _ticking(agent, clock, 0.4)
    assert agent.tier.steps() == [] and _states(recorder) == ["Capturing", "Failed"]
    _publish(tmp_path, 2)
    _ticking(agent, clock, 0.2)  # well inside step 1's back-off
    assert agent.tier.steps() == [2]
    assert _states(recorder)[-2:] == ["Capturing", "Local"]


def test_a_corrupt_local_manifest_is_moved_aside_not_fatal(tmp_path: Path) -> None:
    """One unreadable step-<N>/manifest.json must not stop every start of the
    agent (the sidecar would crash-loop and capture nothing again)."""
    agent, recorder = _agent(tmp_path)
    for step in (5, 6):
        _publish(tmp_path, step)
        agent.capture_newest("schedule")
    (agent.tier.step_dir(5) / "manifest.json").write_text('{"format":2')
    agent.recover()
    assert agent.tier.steps() == [6]
    aside = tmp_path / "local" / ".corrupt-step-5"
    assert (aside / "data" / "w").read_bytes() == bytes([5]) * 1000  # kept for inspection
    failed = [e for e in recorder.events if e.state is State.FAILED]
    assert [e.step for e in failed] == [5] and "unreadable" in failed[0].message
    agent.recover()  # the next start is clean
    assert agent.tier.steps() == [6]


def test_a_corrupt_manifest_newer_than_the_restored_step_is_moved_aside(tmp_path: Path
                                                                       ) -> None:
    agent, recorder = _agent(tmp_path)
    for step in (3, 9):
        _publish(tmp_path, step)
        agent.capture_newest("schedule")
    (agent.tier.step_dir(9) / "manifest.json").write_text('{"format":2')
    result = {"fresh_start": False, "step": 3, "at": time.time()}
    (tmp_path / "work" / "restore.json").write_text(json.dumps(result))
    agent.recover()
    assert agent.tier.steps() == [3]
    assert (tmp_path / "local" / ".corrupt-step-9").is_dir()
    assert [e.step for e in recorder.events if e.state is State.FAILED] == [9]
