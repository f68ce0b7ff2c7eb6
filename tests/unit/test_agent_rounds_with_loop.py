"""A restart in place answered while the agent's own loop goes on
(agent/rounds.py beside agent/loop.py): the loop prunes the work dir and
captures on its thread while the rounds thread places the agreed step; a
SIGTERM may end the loop before it applied a settled round."""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ckptdrain import resume_channel
from ckptdrain.agent import control
from ckptdrain.agent import flush as flush_mod
from ckptdrain.agent import rounds as rounds_mod
from ckptdrain.agent.loop import Agent
from ckptdrain.agent.metrics import AgentMetrics
from ckptdrain.client import CONTROL_DIR, Client
from ckptdrain.manifest import EXTRA_TIMELINE
from ckptdrain.node import config
from ckptdrain.node.localtier import LocalTier
from ckptdrain.restore import meeting as meeting_mod
from ckptdrain.restore.agreement import Decision


class _Quiet:
    def report(self, event: object) -> None:
        pass


def _agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
           agreed: int) -> tuple[Agent, rounds_mod.Rounds, Path]:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    work = tmp_path / "work"
    cfg = config.load(parser.parse_args([]), {
        "CKPTDRAIN_WORK_DIR": str(work), "CKPTDRAIN_LOCAL_DIR": str(tmp_path / "local"),
        "CKPTDRAIN_LOCAL_KEEP": "3", "CKPTDRAIN_WRITERS": "2", "CKPTDRAIN_WRITER_ID": "0",
        "CKPTDRAIN_GRACE_SECONDS": "4"})
    agent = Agent(cfg, LocalTier(cfg.local_dir), _Quiet(), AgentMetrics(), None)

    def agree(*_: Any, **__: Any) -> meeting_mod.Agreed:
        decision = Decision(5, agreed, "agreed", "every rank reported",
                            {0: "uid-0", 1: "uid-1"}, time.time(), f"t-{agreed}")
        return meeting_mod.Agreed(decision, "decided", 0.1, "")
    monkeypatch.setattr(meeting_mod, "agree", agree)
    agent.rounds = rounds_mod.Rounds(agent, meeting=None)
    return agent, agent.rounds, work


def _save(work: Path, step: int) -> None:
    client = Client(work, environ={"CKPTDRAIN_WRITERS": "2", "CKPTDRAIN_WRITER_ID": "0"})
    (client.begin(step) / "model.bin").write_bytes(bytes([step % 256]) * 64)
    client.complete(step)


def _ask(work: Path) -> float:
    asked = time.time()
    (work / CONTROL_DIR).mkdir(parents=True, exist_ok=True)
    (work / CONTROL_DIR / resume_channel.REQUEST_FILE).write_text(
        json.dumps({"at": asked, "pid": 7}))
    return asked


def _loop_tidies_once_placed(agent: Any, rounds: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's turn (housekeeping) the moment a round has placed its step."""
    place = rounds._place

    def place_then_the_loop_tidies(step: int, complete: Any = ()) -> str:
        tier = place(step, complete)
        agent.housekeeping()
        return tier
    monkeypatch.setattr(rounds, "_place", place_then_the_loop_tidies)


def test_the_agreed_step_placed_from_the_local_tier_is_not_pruned_before_the_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The work dir lost step 110 (pruned: the tier holds 120, newer); the
    ranks agree on 110 and the rounds thread copies it back from the tier.
    The loop's housekeeping runs before it applies the round: it must not
    prune the step the answer is about to name."""
    agent, rounds, work = _agent(tmp_path, monkeypatch, agreed=110)
    for step in (110, 120):
        _save(work, step)
        agent.capture_newest("schedule")
    agent.prune_work_dir()
    assert not (work / "step-110").exists()
    _loop_tidies_once_placed(agent, rounds, monkeypatch)
    asked = _ask(work)
    rounds._resume(asked)
    rounds.apply()
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.covers >= asked
    assert (answer.ok, answer.step, answer.tier) == (True, 110, "local")
    assert (work / "step-110" / "model.bin").read_bytes() == bytes([110]) * 64


def test_a_sigterm_before_the_loop_applied_the_round_still_applies_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The round settles while the loop is busy, then SIGTERM ends the loop:
    the flush must not capture the abandoned step 120 as this timeline's
    newest, and the trainer still gets its answer."""
    agent, rounds, work = _agent(tmp_path, monkeypatch, agreed=110)
    _save(work, 110)
    _save(work, 120)
    asked = _ask(work)
    rounds._resume(asked)
    agent.on_sigterm()
    assert agent.flush() == 0
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.covers >= asked and answer.step == 110
    assert agent.tier.steps() == [110]
    assert agent.tier.manifest(110).extra[EXTRA_TIMELINE] == "t-110"


def _answer_fails(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Writing the trainer's answer fails as on a full disk; the names tried."""
    tried, real = [], control.write

    def full(work_dir: Path, name: str, doc: Any) -> Path:
        tried.append(name)
        if name == resume_channel.ANSWER_FILE:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(work_dir, name, doc)
    monkeypatch.setattr(control, "write", full)
    return tried


def test_a_flush_whose_answer_cannot_be_written_still_captures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills up as the pod stops (the emergency save): the answer
    cannot be written, and the flush must go on to capture its step."""
    agent, rounds, work = _agent(tmp_path, monkeypatch, agreed=110)
    _save(work, 110)
    _save(work, 120)
    rounds._resume(_ask(work))
    tried = _answer_fails(monkeypatch)
    agent.on_sigterm()
    assert agent.flush() == 0
    assert resume_channel.ANSWER_FILE in tried
    assert agent.tier.steps() == [110]
    assert agent.tier.manifest(110).extra[EXTRA_TIMELINE] == "t-110"
    assert agent.metrics.errors.labels("resume")._value.get() >= 1


def test_a_tick_whose_answer_cannot_be_written_answers_on_a_later_tick(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent, rounds, work = _agent(tmp_path, monkeypatch, agreed=110)
    _save(work, 110)
    _save(work, 120)
    asked = _ask(work)
    rounds._resume(asked)
    with monkeypatch.context() as patched:
        _answer_fails(patched)
        agent.tick()  # the schedule goes on
    assert agent.tier.steps() == [110]  # captured in the new timeline
    assert agent.metrics.errors.labels("resume")._value.get() == 1
    assert resume_channel.read_answer(work / CONTROL_DIR) is None
    agent.tick()  # room again: the round is applied once more, and answered
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.covers >= asked and answer.step == 110


class _SaysWhenAsked:
    """The agent's work-dir lock, which says when the rounds thread must wait for it."""

    def __init__(self) -> None:
        self.inner = threading.Lock()
        self.asked = threading.Event()

    def __enter__(self) -> None:
        if self.inner.acquire(blocking=False):
            return
        if threading.current_thread() is not threading.main_thread():
            self.asked.set()
        self.inner.acquire()

    def __exit__(self, *exc: object) -> None:
        self.inner.release()


def test_a_step_placed_while_the_loop_prunes_it_is_placed_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop finds step 110 superseded (the tier holds 120) and is about
    to move it aside when the rounds thread places 110 for a round: the
    answer must name a step that is in the work dir."""
    agent, rounds, work = _agent(tmp_path, monkeypatch, agreed=110)
    for step in (110, 120):
        _save(work, step)
        agent.capture_newest("schedule")
    lock = _SaysWhenAsked()
    agent.work_lock = lock  # type: ignore[assignment]
    asked, rename, placing = _ask(work), os.rename, []

    def resume() -> None:
        try:
            rounds._resume(asked)
        finally:
            lock.asked.set()  # it never had to wait: it has placed (or not) by now

    def the_rounds_thread_places_first(src: Any, dst: Any) -> None:
        if Path(src).name == "step-110" and not placing:
            placing.append(threading.Thread(target=resume))
            placing[0].start()
            assert lock.asked.wait(30)
        rename(src, dst)
    monkeypatch.setattr(os, "rename", the_rounds_thread_places_first)
    agent.prune_work_dir()
    assert placing, "the loop did not prune step 110"
    placing[0].join(30)
    rounds.apply()
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.covers >= asked
    assert (answer.ok, answer.step, answer.tier) == (True, 110, "local")
    assert (work / "step-110" / "model.bin").read_bytes() == bytes([110]) * 64


def test_a_placed_step_that_left_the_work_dir_is_not_answered_as_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Something else removed the placed step before the loop applied the
    round: the trainer is told so (and fails loudly), not sent to load a
    directory that is not there."""
    agent, rounds, work = _agent(tmp_path, monkeypatch, agreed=110)
    _save(work, 110)
    asked = _ask(work)
    rounds._resume(asked)
    shutil.rmtree(work / "step-110")
    agent.apply_round()
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.covers >= asked
    assert (answer.ok, answer.step) == (False, 110)
    assert "step 110 is no longer in the work dir" in answer.reason


def test_a_round_that_settles_while_the_flush_waits_is_applied_before_its_capture(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round settled before SIGTERM that the loop had not applied yet, and the
    trainer saved 120 meanwhile: the flush applies it before its capture, so
    it captures in the new timeline, not the abandoned step 120, and the
    trainer gets its answer."""
    agent, rounds, work = _agent(tmp_path, monkeypatch, agreed=110)
    for step in (110, 120):
        _save(work, step)
    agent.capture_newest("schedule")
    asked = _ask(work)
    rounds._resume(asked)
    monkeypatch.setattr(flush_mod, "await_emergency", lambda *_: _save(work, 130))
    monkeypatch.setattr(rounds, "apply", _after_first(rounds.apply))
    agent.on_sigterm()
    assert agent.flush() == 0
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.ok and answer.covers >= asked and answer.step == 110
    assert agent.tier.steps() == [110]
    assert agent.tier.manifest(110).extra[EXTRA_TIMELINE] == "t-110"


def _after_first(apply: Any) -> Any:
    """`apply` doing nothing the first time (the flush's first apply comes
    before the round settles), then as it is."""
    calls: list[None] = []

    def later() -> None:
        calls.append(None)
        if len(calls) > 1:
            apply()
    return later


class _DrainThatRecords:
    """The drain worker as the flush uses it: what was submitted; all done."""

    def __init__(self) -> None:
        self.submitted: list[tuple[int, str]] = []
        self.last_error = None

    def submit(self, step: int, trigger: str = "schedule") -> None:
        self.submitted.append((step, trigger))

    def abandon_above(self, step: int) -> None:
        pass

    def busy_steps(self) -> set[int]:
        return set()

    def is_done(self, step: int) -> bool:
        return True

    def stop(self, timeout: float) -> bool:
        return True


def test_a_flush_after_a_round_it_could_not_apply_sends_no_abandoned_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The abandoned step 120 cannot be removed from the local tier: the
    round stays unapplied, and the flush must not drain 120 as this pod's
    last word."""
    agent, rounds, work = _agent(tmp_path, monkeypatch, agreed=110)
    drain = _DrainThatRecords()
    agent.drain = drain  # type: ignore[assignment]
    for step in (110, 120):
        _save(work, step)
    agent.capture_newest("schedule")
    rounds._resume(_ask(work))

    def busy(step: int) -> None:
        raise OSError(errno.EBUSY, "Device or resource busy")
    monkeypatch.setattr(agent.tier, "remove", busy)
    agent.on_sigterm()
    assert agent.flush() == 0
    assert agent.metrics.errors.labels("resume")._value.get() >= 1
    assert [s for s, trigger in drain.submitted if trigger == "sigterm"] == []


def test_the_agreed_step_found_in_the_work_dir_is_kept_until_the_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 110 is still in the work dir (the tier holds 120, newer, and the
    loop has not pruned yet): found there, it must be kept from then on."""
    agent, rounds, work = _agent(tmp_path, monkeypatch, agreed=110)
    for step in (110, 120):
        _save(work, step)
    agent.capture_newest("schedule")
    _loop_tidies_once_placed(agent, rounds, monkeypatch)
    asked = _ask(work)
    rounds._resume(asked)
    agent.apply_round()
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.covers >= asked
    assert (answer.ok, answer.step, answer.tier) == (True, 110, "work")
    assert (work / "step-110" / "model.bin").read_bytes() == bytes([110]) * 64
