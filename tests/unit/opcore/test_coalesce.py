"""operator/coalesce.py: a burst of asks is one pass; a failed pass is retried."""

from __future__ import annotations

import logging
import threading
import time

from ckptdrain.operator.coalesce import Coalescer

LOG = logging.getLogger("test")


def _wait(done: threading.Event) -> None:
    assert done.wait(5), "the pass never ran"


def test_a_burst_of_asks_is_one_pass_over_the_latest_state() -> None:
    c = Coalescer("test")
    runs: list[int] = []
    done = threading.Event()
    state = {"n": 0}

    def run() -> None:
        runs.append(state["n"])
        done.set()

    scheduled = []
    for n in range(100):
        state["n"] = n
        scheduled.append(c.schedule("k", run, LOG, 0.2))
    _wait(done)
    assert scheduled.count(True) == 1
    assert runs == [99]  # it read what was there when it ran, not when asked
    # Once it ran, the next ask schedules again; another key is independent.
    done.clear()
    assert c.schedule("k", run, LOG, 0.01) and c.schedule("other", lambda: None, LOG, 0.01)
    _wait(done)


def test_a_failed_pass_is_retried() -> None:
    c = Coalescer("test", retry_delay=0.05)
    calls: list[float] = []
    done = threading.Event()

    def flaky() -> None:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise ConnectionError("apiserver away")
        done.set()

    c.schedule("k", flaky, LOG, 0.01)
    _wait(done)
    assert len(calls) == 3


def test_an_ask_due_sooner_brings_the_pending_pass_forward() -> None:
    c = Coalescer("test")
    runs: list[float] = []
    done = threading.Event()
    start = time.monotonic()

    def run() -> None:
        runs.append(time.monotonic() - start)
        done.set()

    assert c.schedule("k", run, LOG, 30.0)  # a heartbeat, far off
    assert c.schedule("k", run, LOG, 0.05)  # a pod event: now
    assert not c.schedule("k", run, LOG, 10.0)  # absorbed by the one due sooner
    _wait(done)
    time.sleep(0.2)
    assert len(runs) == 1 and runs[0] < 5


def test_one_keys_passes_never_overlap_and_an_ask_during_a_pass_runs_after_it() -> None:
    c = Coalescer("test")
    inside, release, second = threading.Event(), threading.Event(), threading.Event()
    active, most = [0], [0]
    lock = threading.Lock()

    def run() -> None:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            if not inside.is_set():
                inside.set()
                assert release.wait(5)
            else:
                second.set()
        finally:
            with lock:
                active[0] -= 1

    c.schedule("k", run, LOG, 0.0)
    assert inside.wait(5)
    assert c.schedule("k", run, LOG, 0.0)  # asked while the first pass runs
    time.sleep(0.2)
    assert not second.is_set(), "the second pass started beside the first"
    release.set()
    _wait(second)
    assert most[0] == 1


def test_a_thousand_keys_due_at_once_run_on_a_few_threads() -> None:
    c = Coalescer("test", workers=3)
    release = threading.Event()
    active, most, done = [0], [0], []
    lock = threading.Lock()
    finished = threading.Event()

    def run(n: int) -> None:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        release.wait(5)
        with lock:
            active[0] -= 1
            done.append(n)
            if len(done) == 1000:
                finished.set()

    threads_before = threading.active_count()
    for n in range(1000):
        c.schedule(("policy", n), lambda n=n: run(n), LOG, 0.0)
    time.sleep(0.2)
    assert threading.active_count() - threads_before <= 3
    assert c.pending() == 1000 - 3
    release.set()
    _wait(finished)
    assert most[0] == 3 and sorted(done) == list(range(1000))


def test_keys_run_earliest_due_first() -> None:
    c = Coalescer("test", workers=1)
    order: list[str] = []
    done = threading.Event()
    gate = threading.Event()
    c.schedule("block", lambda: gate.wait(5), LOG, 0.0)
    time.sleep(0.05)
    c.schedule("late", lambda: (order.append("late"), done.set()), LOG, 0.3)
    c.schedule("early", lambda: order.append("early"), LOG, 0.1)
    gate.set()
    _wait(done)
    assert order == ["early", "late"]
