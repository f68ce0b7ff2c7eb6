"""No silent stall (transfer/stall.py, contract/drain.py): the pure clock and the guard."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from ckptdrain.agent.report import CheckpointEvent
from ckptdrain.contract.drain import DEFAULT_STALL_AFTER, parse_stall_timeout
from ckptdrain.errors import InvalidInput, StoreUnreachable
from ckptdrain.transfer.stall import DrainStalled, StallClock, StallGuard


def test_a_mark_that_does_not_move_for_the_bound_is_a_stall() -> None:
    c = StallClock(stall_after=300.0, started=0.0)
    assert not c.observe(0, now=10.0)
    assert not c.observe(5, now=200.0)  # moved: the clock restarts here
    assert not c.observe(5, now=499.0)
    assert c.observe(5, now=500.0)
    assert c.idle(600.0) == 400.0


def test_no_progress_at_all_from_the_start_counts_from_the_start() -> None:
    c = StallClock(stall_after=60.0, started=100.0)
    assert not c.observe(0, now=150.0)  # first look: a baseline, not progress
    assert c.observe(0, now=160.0)


def test_the_guard_cancels_once_and_says_why() -> None:
    cancel, said = threading.Event(), []
    with StallGuard(0.05, lambda: 7, cancel, said.append, what="drain of step 3") as guard:
        assert cancel.wait(30)  # it fires by itself
    assert guard.stalled and len(said) == 1
    assert "drain of step 3: no progress for" in said[0] and "drain.stallTimeout" in said[0]
    err = guard.error()
    assert isinstance(err, DrainStalled) and isinstance(err, StoreUnreachable)  # retried


def test_the_guard_stays_quiet_while_the_mark_moves() -> None:
    cancel, said, mark = threading.Event(), [], iter(range(10**9))
    with StallGuard(0.5, lambda: next(mark), cancel, said.append) as guard:
        assert not cancel.wait(1.0)
    assert not guard.stalled and said == []


def test_stall_timeout_is_a_duration_of_at_least_ten_seconds() -> None:
    assert parse_stall_timeout("spec.drain.stallTimeout", "5m") == DEFAULT_STALL_AFTER
    assert parse_stall_timeout("x", "10s") == 10.0
    for bad in ("5s", "0", "soon", ""):
        with pytest.raises(InvalidInput, match=r"spec\.drain\.stallTimeout"):
            parse_stall_timeout("spec.drain.stallTimeout", bad)


class _Recorder:
    def __init__(self) -> None:
        self.events: list[CheckpointEvent] = []

    def report(self, event: CheckpointEvent) -> None:
        self.events.append(event)


def test_slow_retention_after_the_commit_is_not_a_stalled_drain(tmp_path: Path) -> None:
    """The step is global before retention runs: retention taking longer
    than the stall bound must neither cancel nor report a stall."""
    from ckptdrain.agent.drainworker import DrainWorker
    from ckptdrain.agent.metrics import AgentMetrics
    from ckptdrain.node.localtier import LocalTier
    from ckptdrain.store.local import LocalStore
    from ckptdrain.transfer.drain import Drainer

    tier = LocalTier(tmp_path / "local")
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"\x07" * 1000)
    tier.capture(src, 1, writer=0, writers=1)
    store = LocalStore(str(tmp_path / "store"))
    pruned = threading.Event()

    def slow_retention(step: int) -> None:
        threading.Event().wait(1.5)  # many listings on a slow store: no bytes sent
        pruned.set()

    recorder, metrics = _Recorder(), AgentMetrics()
    worker = DrainWorker(tier, store, Drainer(store), recorder, metrics,
                         part_size=1 << 20, on_global=slow_retention, stall_after=0.3)
    worker.start()
    worker.submit(1)
    assert pruned.wait(30)
    assert worker.stop(30)
    assert tier.is_global(1)
    assert metrics.store.stalls._value.get() == 0
    assert not any("no progress for" in e.message for e in recorder.events)
    assert recorder.events[-1].state.value == "Global"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_guard_cancels_even_when_saying_so_fails() -> None:
    cancel = threading.Event()

    def broken_reporter(message: str) -> None:
        raise RuntimeError("the reporter is down")

    with StallGuard(0.05, lambda: 7, cancel, broken_reporter):
        assert cancel.wait(5)  # a stalled drain is cancelled all the same
