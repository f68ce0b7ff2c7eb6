"""Restore rounds (agent/rounds.py) that settle late, or whose abandoned steps
resist removal: no abandoned step is captured into the new timeline or
drained, and the trainer is always answered."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from tests.unit.test_agent_rounds_with_loop import _agent, _ask, _DrainThatRecords, _save

from ckptdrain import resume_channel
from ckptdrain.agent import flush as flush_mod
from ckptdrain.agent import rounds as rounds_mod
from ckptdrain.client import CONTROL_DIR


class _DrainThatAbandons(_DrainThatRecords):
    """Records what it was told to abandon too: a step submitted and then
    abandoned is not drained."""

    def __init__(self) -> None:
        super().__init__()
        self.abandoned: list[int] = []

    def abandon_above(self, step: int) -> None:
        self.abandoned.append(step)

    def drained(self) -> set[int]:
        bounds = self.abandoned
        return {s for s, _ in self.submitted if not any(s > b for b in bounds)}


def test_an_abandoned_step_whose_files_cannot_be_removed_is_not_captured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 120 holds a file the pod may not delete: it is renamed aside at
    once (no step any more), so the next tick does not capture it under the
    new timeline."""
    agent, rounds, work = _agent(tmp_path, monkeypatch, agreed=110)
    _save(work, 110)
    _save(work, 120)
    rounds._resume(_ask(work))
    real = shutil.rmtree

    def stuck(path: Any, *args: Any, **kwargs: Any) -> None:
        if "step-120" in Path(path).name:
            return  # nothing of it goes (a trainer's file the pod's group cannot delete)
        real(path, *args, **kwargs)
    monkeypatch.setattr(shutil, "rmtree", stuck)
    agent.tick()
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.ok and answer.step == 110
    assert 120 not in agent.tier.steps()
    assert not (work / "step-120").exists()
    assert [p.name for p in work.glob(".prune-step-120-*")] == [f".prune-step-120-{os.getpid()}"]


def test_an_abandoned_step_that_cannot_be_renamed_aside_keeps_the_round_settled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent, rounds, work = _agent(tmp_path, monkeypatch, agreed=110)
    _save(work, 110)
    _save(work, 120)
    rounds._resume(_ask(work))
    real = os.rename

    def refused(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if Path(src).name == "step-120":
            raise PermissionError(13, "Permission denied", str(src))
        real(src, dst, *args, **kwargs)
    monkeypatch.setattr(rounds_mod.os, "rename", refused)
    agent.apply_round()
    assert resume_channel.read_answer(work / CONTROL_DIR) is None  # not answered yet
    assert rounds.abandoning() == 110
    assert agent.metrics.errors.labels("resume")._value.get() == 1
    monkeypatch.setattr(rounds_mod.os, "rename", real)
    agent.apply_round()
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.ok and answer.step == 110
    assert rounds.abandoning() is None
    assert not (work / "step-120").exists()


def test_a_round_that_settles_after_the_flushs_last_apply_is_answered_no(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The round was running at SIGTERM and settles after the flush applied
    its last round: the trainer is told the pod stops, not left waiting."""
    agent, rounds, work = _agent(tmp_path, monkeypatch, agreed=110)
    _save(work, 110)
    asked = _ask(work)
    monkeypatch.setattr(flush_mod, "await_emergency", lambda *_: None)
    agent.on_sigterm()
    assert agent.flush() == 0
    rounds._resume(asked)  # the round opened before SIGTERM settles only now
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and not answer.ok and answer.why == "stopping"
    assert rounds.abandoning() is None


def _round_settles_in_the_flushs_capture(agent: Any, rounds: Any, work: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> _DrainThatAbandons:
    """Step 110 captured, 120 saved, and a round keeping 110 that settles
    while the flush captures 120 (it ran before SIGTERM came)."""
    drain = _DrainThatAbandons()
    agent.drain = drain
    _save(work, 110)
    agent.capture_newest("schedule")
    _save(work, 120)
    asked = _ask(work)
    monkeypatch.setattr(flush_mod, "await_emergency", lambda *_: None)
    real = agent.tier.capture
    terminating = agent.terminating

    def capture(*args: Any, **kwargs: Any) -> Any:
        terminating.clear()
        rounds._resume(asked)
        terminating.set()
        return real(*args, **kwargs)
    monkeypatch.setattr(agent.tier, "capture", capture)
    return drain


def test_a_round_that_settles_during_the_flushs_capture_drains_no_abandoned_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 120 is being captured by the flush when the round (kept step 110)
    settles: 120 is not drained, and the round is applied (answered)."""
    agent, rounds, work = _agent(tmp_path, monkeypatch, agreed=110)
    drain = _round_settles_in_the_flushs_capture(agent, rounds, work, monkeypatch)
    agent.on_sigterm()
    assert agent.flush() == 0
    assert 120 not in drain.drained()
    assert (120, "sigterm") not in drain.submitted
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.ok and answer.step == 110
    assert 120 not in agent.tier.steps()


def test_a_round_settled_during_the_flushs_capture_that_cannot_be_applied_drains_nothing_above(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent, rounds, work = _agent(tmp_path, monkeypatch, agreed=110)
    drain = _round_settles_in_the_flushs_capture(agent, rounds, work, monkeypatch)

    def cannot(*_: Any, **__: Any) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(rounds_mod.control, "write", cannot)
    agent.on_sigterm()
    assert agent.flush() == 0
    assert rounds.abandoning() == 110
    assert 120 not in drain.drained()
    assert 110 in drain.abandoned


def test_an_abandoned_step_is_renamed_aside_beside_what_an_earlier_drop_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `.prune-step-120-<pid>` that cannot be removed does not block the
    rename (renaming onto a non-empty directory fails): the round is applied."""
    agent, rounds, work = _agent(tmp_path, monkeypatch, agreed=110)
    _save(work, 110)
    _save(work, 120)
    left = work / f".prune-step-120-{os.getpid()}"
    (left / "stuck").mkdir(parents=True)
    (left / "stuck" / "file").write_bytes(b"x")
    real = shutil.rmtree

    def stuck(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path) == left:
            return  # what the pod's group cannot delete
        real(path, *args, **kwargs)
    monkeypatch.setattr(shutil, "rmtree", stuck)
    rounds._resume(_ask(work))
    agent.apply_round()
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.ok and answer.step == 110
    assert not (work / "step-120").exists()
