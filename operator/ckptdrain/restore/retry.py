"""How long, and how often, restore asks a global tier that does not answer. Pure.

A pod that restarts while the store is down must not fail at once: with
`restartPolicy: Never` a failed init container fails the pod and spends one
of the Job's `backoffLimit`, and with `OnFailure` every restart counts too.
So restore retries inside the init container, until the policy's
`restore.retryDeadline` (default 10m), and only then exits 3.

Delays grow from `FIRST` doubling to `CAP` with "equal jitter" (each delay
is drawn from its upper half): the writers of a job restarting together do
not all knock again at the same instant, and none waits less than half its
share. The last try falls on the deadline itself, never past it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

FIRST = 1.0
CAP = 30.0

T = TypeVar("T")


def delay(attempt: int, rng: random.Random, first: float = FIRST, cap: float = CAP) -> float:
    """Seconds to wait after failed try number `attempt` (1-based)."""
    ceiling = min(cap, first * 2 ** max(0, attempt - 1))
    return ceiling / 2 + rng.random() * ceiling / 2


@dataclass(frozen=True)
class Outcome(Generic[T]):
    value: T
    attempts: int
    gave_up: bool


def until_deadline(
    attempt: Callable[[int], T],
    transient: Callable[[T], bool],
    deadline_s: float,
    *,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    rng: random.Random,
    on_retry: Callable[[int, T, float], None] | None = None,
) -> Outcome[T]:
    """Call `attempt(n)` until its value is not `transient`, or `deadline_s`
    from the first call has passed. `on_retry(n, value, wait)` is told
    before each wait. `gave_up` is true when the last value was transient."""
    start = clock()
    n = 1
    while True:
        value = attempt(n)
        if not transient(value):
            return Outcome(value, n, False)
        remaining = start + deadline_s - clock()
        if remaining <= 0:
            return Outcome(value, n, True)
        wait = min(delay(n, rng), remaining)
        if on_retry is not None:
            on_retry(n, value, wait)
        sleep(wait)
        n += 1
