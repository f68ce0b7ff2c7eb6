"""One token bucket for every byte a process sends.

Pure: no I/O, no clock it did not receive. Every sender (all files, all parts,
all threads) draws from the same bucket, so the process as a whole stays at
the rate, unlike per-transfer limits that add up when transfers run in
parallel.

The bucket holds at most `burst_seconds` of tokens (30 ms by default), so in
any window of T seconds at most rate × T + rate × 0.03 bytes are granted:
a 1 s window can exceed the rate by at most 3%. It starts empty, so a fresh
bucket does not open with a burst. Large requests are granted in small
slices, and a waiter never sleeps longer than `max_sleep` before looking at
the rate again, so `set_rate` takes effect within `max_sleep` (0.1 s) even for
threads already blocked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: Slices a large request is granted in: 10 ms of rate, at least 64 KiB.
_SLICE_SECONDS = 0.01
_MIN_SLICE = 64 << 10


class TokenBucket:
    """A thread-safe token bucket in bytes; rate None means unlimited."""

    def __init__(
        self,
        rate: float | None = None,
        *,
        burst_seconds: float = 0.03,
        max_sleep: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if burst_seconds <= 0 or max_sleep <= 0:
            raise ValueError("burst_seconds and max_sleep must be positive")
        self._burst_seconds = burst_seconds
        self._max_sleep = max_sleep
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._rate: float | None = None
        self._tokens = 0.0
        self._stamp = clock()
        self._granted = 0
        self.set_rate(rate)

    @property
    def rate(self) -> float | None:
        """Current rate in bytes/s, or None when unlimited."""
        return self._rate

    @property
    def granted(self) -> int:
        """Bytes granted so far (all callers, all rates)."""
        return self._granted

    def set_rate(self, rate: float | None) -> None:
        """Change the rate; blocked callers follow within `max_sleep` seconds."""
        if rate is not None and not rate > 0:
            raise ValueError(f"rate must be positive or None, got {rate!r}")
        with self._lock:
            self._refill()
            self._rate = float(rate) if rate is not None else None
            # A lower rate must not inherit a burst sized for the higher one.
            self._tokens = min(self._tokens, self._capacity())

    def acquire(self, n: int, should_stop: Callable[[], bool] | None = None) -> bool:
        """Block until `n` bytes may be sent. False if `should_stop` said so first
        (what was already granted stays spent: those bytes may have gone)."""
        remaining = n
        while remaining > 0:
            with self._lock:
                if self._rate is None:
                    self._granted += remaining
                    return True
                self._refill()
                want = min(remaining, self._slice())
                # The tolerance absorbs float rounding: without it a waiter
                # could nap for 1e-17 s forever.
                if self._tokens >= want - 1e-6 * want - 1e-3:
                    self._tokens = max(0.0, self._tokens - want)
                    self._granted += want
                    remaining -= want
                    continue
                wait = (want - self._tokens) / self._rate
            if should_stop is not None and should_stop():
                return False
            # Short naps, so a new rate (or a stop) is seen quickly.
            self._sleep(min(wait, self._max_sleep))
        return True

    def _capacity(self) -> float:
        return 0.0 if self._rate is None else self._rate * self._burst_seconds

    def _slice(self) -> int:
        assert self._rate is not None
        # Never ask for more than the bucket holds, or we would wait forever;
        # at most half of it, so a nap that overruns a little loses no tokens.
        cap = self._capacity() / 2
        return max(1, int(min(max(self._rate * _SLICE_SECONDS, _MIN_SLICE), cap)))

    def _refill(self) -> None:
        now = self._clock()
        if self._rate is not None:
            self._tokens = min(self._capacity(), self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now
