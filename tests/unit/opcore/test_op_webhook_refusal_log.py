"""A refused client certificate is said once at once, then at most once a
minute with the count of refusals the line stands for: a forger retrying
in a loop cannot flood the operator's log."""

from __future__ import annotations

import threading

from ckptdrain.operator.admission.refusal_log import REFUSAL_LOG_INTERVAL_S, RefusalLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_first_refusal_is_said_at_once() -> None:
    assert RefusalLog(clock=Clock()).note() == 1


def test_refusals_within_the_minute_are_counted_into_the_next_line() -> None:
    clock = Clock()
    refusals = RefusalLog(clock=clock)
    assert refusals.note() == 1
    for _ in range(499):
        clock.now += 0.1
        assert refusals.note() == 0
    clock.now = 1000.0 + REFUSAL_LOG_INTERVAL_S
    # This one and the 499 unsaid: 500 refusals since the last line.
    assert refusals.note() == 500
    clock.now += 1
    assert refusals.note() == 0


def test_a_refusal_after_a_quiet_minute_is_said_alone() -> None:
    clock = Clock()
    refusals = RefusalLog(clock=clock)
    assert refusals.note() == 1
    clock.now += 3600
    assert refusals.note() == 1


def test_no_refusal_is_lost_across_threads() -> None:
    clock = Clock()
    refusals = RefusalLog(clock=clock)
    said: list[int] = []

    def refuse() -> None:
        for _ in range(1000):
            said.append(refusals.note())

    threads = [threading.Thread(target=refuse) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    clock.now += REFUSAL_LOG_INTERVAL_S
    said.append(refusals.note())
    assert sum(said) == 4001 and said.count(0) == 3999
