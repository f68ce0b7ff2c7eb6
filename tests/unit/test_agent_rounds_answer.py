"""A trainer restarted in place always gets its agent's answer (agent/rounds.py).

The resume thread settles a round and the agent's own loop applies it
(apply(): switch the timeline, drop abandoned steps, answer). The loop may
run at any moment, also right after the resume thread hands a decision over.
An answer handed over apart from its decision was lost when the loop ran in
between: the trainer waited for good (seen on a real cluster, where the
second request of a restarted trainer got no answer).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ckptdrain import resume_channel
from ckptdrain.agent import rounds as rounds_mod
from ckptdrain.client import CONTROL_DIR, Client
from ckptdrain.restore import meeting as meeting_mod
from ckptdrain.restore.agreement import Decision


class _EmptyTier:
    def steps(self) -> list[int]:
        return []

    def has(self, step: int) -> bool:
        return False

    def remove(self, step: int) -> None:
        raise AssertionError("no local step to drop")


class _LoopRunsOnRelease:
    """The resume thread's lock, where the agent's loop takes its turn the
    moment the lock is free: the worst moment for a hand-over."""

    def __init__(self) -> None:
        self.inner = threading.Lock()
        self.rounds: rounds_mod.Rounds | None = None
        self._in_loop = False

    def __enter__(self) -> None:
        self.inner.acquire()

    def __exit__(self, *exc: object) -> None:
        self.inner.release()
        if self.rounds is not None and not self._in_loop:
            self._in_loop = True
            try:
                self.rounds.apply()
            finally:
                self._in_loop = False


class _Passes:
    """The rounds thread's stop event: `n` passes of its loop, no waiting."""

    def __init__(self, n: int) -> None:
        self.left = n

    def is_set(self) -> bool:
        self.left -= 1
        return self.left < 0

    def wait(self, _: float) -> bool:
        return False


def _poll(rounds: rounds_mod.Rounds) -> None:
    """One pass of the rounds thread: it reads the request and acts on it."""
    rounds._stop = _Passes(1)  # type: ignore[assignment]
    rounds._loop()


def _rounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decided: list[int | Exception],
            loop_on_release: bool = True) -> tuple[rounds_mod.Rounds, Path]:
    work = tmp_path / "work"
    work.mkdir()
    cfg = SimpleNamespace(writer=0, writers=2, pod_uid="uid-0", pod_name="llm-0",
                          node_name="node-a", work_dir=work,
                          trainer_work_dir=Path("/ckptdrain/work"),
                          restore_agree_timeout_s=30.0)
    agent = SimpleNamespace(cfg=cfg, tier=_EmptyTier(), drain=None, keep_in_work=set(),
                            work_lock=threading.Lock(),
                            timeline="t1", resumed=100,
                            terminating=threading.Event())
    rounds_left = iter(range(5, 100))

    def agree(*_: Any, **__: Any) -> meeting_mod.Agreed:
        step = decided.pop(0)
        if isinstance(step, Exception):
            raise step
        decision = Decision(next(rounds_left), step, "agreed", "every rank reported",
                            {0: "uid-0", 1: "uid-1"}, time.time(), f"t-{step}")
        return meeting_mod.Agreed(decision, "decided", 0.1, "")
    monkeypatch.setattr(meeting_mod, "agree", agree)
    rounds = rounds_mod.Rounds(agent, meeting=None)
    if not loop_on_release:
        return rounds, work
    lock = _LoopRunsOnRelease()
    lock.rounds = rounds
    rounds._lock = lock  # type: ignore[assignment]
    return rounds, work


def _save(work: Path, step: int) -> None:
    client = Client(work, environ={"CKPTDRAIN_WRITERS": "2", "CKPTDRAIN_WRITER_ID": "0"})
    (client.begin(step) / "model.bin").write_bytes(b"x" * 64)
    client.complete(step)


def _ask(work: Path) -> float:
    asked = time.time()
    (work / CONTROL_DIR).mkdir(exist_ok=True)
    (work / CONTROL_DIR / resume_channel.REQUEST_FILE).write_text(
        json.dumps({"at": asked, "pid": 7}))
    return asked


def test_the_answer_is_written_when_the_loop_applies_the_round_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rounds, work = _rounds(tmp_path, monkeypatch, decided=[110])
    _save(work, 110)
    _save(work, 120)  # this rank's step past the agreed one: abandoned
    asked = _ask(work)
    rounds._resume(asked)
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.covers >= asked
    assert (answer.ok, answer.step, answer.tier, answer.round) == (True, 110, "work", 5)
    assert answer.path == "/ckptdrain/work/step-110"
    assert not (work / "step-120").exists() and rounds.agent.timeline == "t-110"


def test_each_of_two_requests_in_a_row_gets_its_own_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two calls of restored() (two processes, or one asking twice): each
    request is answered by the round it opened."""
    rounds, work = _rounds(tmp_path, monkeypatch, decided=[110, 110])
    _save(work, 110)
    for round_ in (5, 6):
        asked = _ask(work)
        rounds._resume(asked)
        rounds.apply()  # the loop's next turn changes nothing
        answer = resume_channel.read_answer(work / CONTROL_DIR)
        assert answer is not None and answer.covers >= asked, f"round {round_}"
        assert (answer.step, answer.round) == (110, round_)


def test_a_failed_round_is_not_overwritten_by_the_answer_of_the_round_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second request while the loop has not yet applied the first round
    (it is busy capturing): the second round fails and says so; the first
    round's answer, older, must not replace it, or the second trainer waits
    for good."""
    rounds, work = _rounds(tmp_path, monkeypatch, loop_on_release=False,
                           decided=[110, meeting_mod.Unsettled("the others did not come back")])
    _save(work, 110)
    _save(work, 120)
    rounds._resume(_ask(work))  # settled; the loop is busy
    second = _ask(work)
    _poll(rounds)
    rounds.apply()
    _poll(rounds)
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.covers >= second
    assert (answer.ok, answer.why) == (False, "unsettled")
    assert rounds.agent.timeline == "t-110"  # the first round was applied all the same


def test_a_round_that_places_a_newer_step_keeps_it_when_the_round_before_is_applied(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop applies the first round (dropping every step above its own)
    just after the second round placed a newer step (all ranks have it in
    the global tier): the second answer must name a step that is still in
    the work dir."""
    rounds, work = _rounds(tmp_path, monkeypatch, loop_on_release=False, decided=[110, 120])
    _save(work, 110)
    _save(work, 120)

    def place_then_the_loop_runs(step: int, complete: Any = ()) -> str:
        """The step is placed (fetched from the global tier when the work
        dir lost it); the loop runs at that very moment."""
        if not (work / f"step-{step}").is_dir():
            _save(work, step)
        rounds.apply()
        return "global"
    monkeypatch.setattr(rounds, "_place", place_then_the_loop_runs)
    rounds._resume(_ask(work))  # settled; the loop is busy
    second = _ask(work)
    for _ in range(3):
        _poll(rounds)
        rounds.apply()
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.covers >= second
    assert (answer.ok, answer.step) == (True, 120)
    assert (work / "step-120").is_dir() and rounds.agent.timeline == "t-120"


class _DrainThatReports:
    """The drain worker, whose abandon_above() the loop calls halfway
    through apply(): there another rank's round asks what this rank holds."""

    def __init__(self, rounds: rounds_mod.Rounds) -> None:
        self.rounds, self.reports = rounds, []

    def abandon_above(self, keep: int) -> None:
        self.reports.append(self.rounds.holdings(9))


def test_another_ranks_round_never_sees_an_abandoned_step_in_the_new_timeline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """apply() switches the timeline and drops the abandoned steps; a report
    made in between (another rank's round) must not offer the abandoned
    step 120 as one of the new timeline: ranks would agree on it and this
    one resume from the state its trainer abandoned."""
    rounds, work = _rounds(tmp_path, monkeypatch, loop_on_release=False, decided=[110])
    _save(work, 110)
    _save(work, 120)
    drain = _DrainThatReports(rounds)
    rounds.agent.drain = drain
    listing, applied = rounds_mod.completed_steps, []

    def listed_then_applied(path: Path) -> list[int]:
        steps = listing(path)
        if not applied:
            applied.append(True)
            rounds.apply()  # the loop's turn, right after the report listed the work dir
        return steps
    rounds._resume(_ask(work))
    monkeypatch.setattr(rounds_mod, "completed_steps", listed_then_applied)
    late = rounds.holdings(8)
    assert drain.reports, "apply() ran while a report was being made"
    for report in (*drain.reports, late):
        assert report.local.get(120) in (None, "t1"), report


def test_a_request_made_while_the_loop_writes_an_answer_waits_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rounds thread polls just before the loop writes the first round's
    answer: the round is still settled then, so the second request waits,
    and its own answer (a failure) comes after the first, not before it."""
    rounds, work = _rounds(tmp_path, monkeypatch, loop_on_release=False,
                           decided=[110, meeting_mod.Unsettled("the others did not come back")])
    _save(work, 110)
    _save(work, 120)
    rounds._resume(_ask(work))
    second = _ask(work)
    write = rounds._answer

    def the_rounds_thread_polls_first(started: float, answer: resume_channel.Answer) -> None:
        if answer.ok:
            _poll(rounds)
        write(started, answer)
    monkeypatch.setattr(rounds, "_answer", the_rounds_thread_polls_first)
    rounds.apply()
    _poll(rounds)
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.covers >= second
    assert (answer.ok, answer.why) == (False, "unsettled")


class _DrainThatRecords:
    def __init__(self) -> None:
        self.abandoned: list[int] = []

    def abandon_above(self, keep: int) -> None:
        self.abandoned.append(keep)


def test_the_trainer_is_answered_only_once_the_abandoned_steps_are_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Answered earlier, the trainer could save its next step while the
    abandoned one of the same number is still there, or still draining."""
    rounds, work = _rounds(tmp_path, monkeypatch, loop_on_release=False, decided=[110])
    _save(work, 110)
    _save(work, 120)
    drain = _DrainThatRecords()
    rounds.agent.drain = drain
    seen: list[tuple[bool, list[int], str | None]] = []
    write = rounds._answer

    def answer(started: float, ans: resume_channel.Answer) -> None:
        seen.append(((work / "step-120").exists(), list(drain.abandoned),
                     rounds.agent.timeline))
        write(started, ans)
    monkeypatch.setattr(rounds, "_answer", answer)
    rounds._resume(_ask(work))
    rounds.apply()
    assert seen == [(False, [110], "t-110")]


def test_a_step_that_could_not_be_placed_is_not_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kept only once it is in the work dir: a step kept that never came
    would be kept (from pruning) whenever it later does."""
    rounds, work = _rounds(tmp_path, monkeypatch, loop_on_release=False, decided=[130])
    _save(work, 110)
    asked = _ask(work)
    _poll(rounds)  # 130 is neither in the work dir nor on this node, and there is no store
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.covers >= asked
    assert (answer.ok, answer.step) == (False, 130) and "130" in answer.reason
    assert rounds.agent.keep_in_work == set()


def test_a_new_round_applied_lets_the_loop_prune_the_step_of_the_one_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rounds, work = _rounds(tmp_path, monkeypatch, loop_on_release=False, decided=[110, 105])
    rounds.agent.keep_in_work.add(100)  # the step restore placed when the pod started
    for step in (105, 110, 120):
        _save(work, step)
    for agreed in (110, 105):
        asked = _ask(work)
        _poll(rounds)
        rounds.apply()
        answer = resume_channel.read_answer(work / CONTROL_DIR)
        assert answer is not None and answer.covers >= asked and answer.step == agreed
    assert rounds.agent.keep_in_work == {105}


def test_a_request_while_the_pod_stops_opens_no_round_and_fails_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A round the SIGTERM flush would not apply: the trainer, stopping too,
    is told at once rather than left waiting for an answer that never comes."""
    decided: list[int | Exception] = [110]
    rounds, work = _rounds(tmp_path, monkeypatch, loop_on_release=False, decided=decided)
    _save(work, 110)
    rounds.agent.terminating.set()
    asked = _ask(work)
    _poll(rounds)
    answer = resume_channel.read_answer(work / CONTROL_DIR)
    assert answer is not None and answer.covers >= asked
    assert (answer.ok, answer.why, answer.reason) == (False, "stopping", "the pod is stopping")
    assert decided == [110], "a round was opened"
