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
