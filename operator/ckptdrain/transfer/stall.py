"""No silent stall: a drain that makes no progress for a bounded time fails that attempt.

Users of other tools report multi-hundred-GB uploads that stop with no
error: a connection that hangs, a store that answers 503 for ever. Here a
drain attempt is watched while it runs; when no byte went out and no part
became durable for `stall_after` seconds (the policy's drain.stallTimeout),
the watch says so at once (`on_stall`: the agent logs, counts and reports
it on the checkpoint's record), cancels the attempt, and the caller turns
the cancellation into `DrainStalled`, a transient failure retried like any
other. A request already on the wire ends within the store client's own
timeouts; the journal keeps whatever became durable.

`StallClock` is the pure part (progress marks against a clock it is
given); `StallGuard` is the thread around it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ckptdrain import units
from ckptdrain.contract.drain import DEFAULT_STALL_AFTER as DEFAULT_STALL_AFTER
from ckptdrain.errors import StoreUnreachable


class DrainStalled(StoreUnreachable):
    """A drain attempt made no progress for the stall bound: failed, retried."""


@dataclass
class StallClock:
    """When progress was last seen. Progress is any change of a mark (a
    monotonically growing count of bytes sent or made durable)."""

    stall_after: float
    started: float
    last_mark: int | None = None  # None: not looked at yet
    last_change: float = 0.0

    def __post_init__(self) -> None:
        self.last_change = self.started

    def observe(self, mark: int, now: float) -> bool:
        """Record `mark` at `now`; True when it has not moved for stall_after."""
        if self.last_mark is None:
            self.last_mark = mark  # the first look is the baseline, not progress
        elif mark != self.last_mark:
            self.last_mark, self.last_change = mark, now
        return now - self.last_change >= self.stall_after

    def idle(self, now: float) -> float:
        return now - self.last_change


class StallGuard:
    """Watch `mark()` while a drain runs; on a stall call `on_stall(message)`
    once and set `cancel`. Use as a context manager around the drain."""

    def __init__(self, stall_after: float, mark: Callable[[], int], cancel: threading.Event,
                 on_stall: Callable[[str], None], *, what: str = "drain",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = StallClock(stall_after, clock())
        self._mark, self._cancel, self._on_stall = mark, cancel, on_stall
        self._what, self._now = what, clock
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stall-guard", daemon=True)
        self.message: str | None = None

    @property
    def stalled(self) -> bool:
        return self.message is not None

    def __enter__(self) -> StallGuard:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def error(self) -> DrainStalled:
        return DrainStalled(self.message or f"{self._what}: stalled")

    def _watch(self) -> None:
        period = min(1.0, self.clock.stall_after / 10)
        while not self._done.wait(period):
            if self.clock.observe(self._mark(), self._now()):
                self.message = (f"{self._what}: no progress for "
                                f"{units.format_duration(self.clock.stall_after)} "
                                "(drain.stallTimeout); attempt cancelled, will retry")
                try:
                    self._on_stall(self.message)
                finally:  # a reporter's failure must not leave the stall running
                    self._cancel.set()
                return
