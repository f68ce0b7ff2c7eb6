"""How hard the whole process may press on a store that says "slow down".

Pure: no I/O, no clock or randomness it did not receive. One `Congestion`
state is shared by every request the process sends to a store (all files,
all parts, all threads, drain and restore alike), so when the store answers
503 SlowDown, 429 or times out, the process as a whole backs off, instead
of each request retrying on its own schedule (which is how thousands of
workers turn one throttle into a stampede).

AIMD, as TCP does it:

- `window`: how many requests may be in flight at once. A congestion
  signal halves it, or the requests actually in flight if fewer
  (multiplicative decrease, never below `min_window`);
  every `window` successful answers add one (additive increase, at most
  `max_window`), so the window grows back by about one per round of
  requests.
- `pause_until`: after a signal nobody starts a request for a shared
  back-off (`backoff`, doubled per consecutive signal up to `max_backoff`,
  with jitter so processes do not resume in step); a success resets it.
- Probing carefully: the window at which the store last complained is
  remembered (`ceiling`); growing back to it takes `probe_rounds` rounds
  of answers instead of one, doubled each time the store complains at the
  same level again (up to `max_probe_rounds`). A store with a hard limit
  (a prefix at its request rate) is then probed ever less often instead of
  being refused once per few rounds for ever; a window that grows past the
  ceiling without complaint forgets it (the store's capacity went up).
- Signals closer together than `cooldown` are one congestion event: eight
  requests in flight that all get 503 at once halve the window once, not
  eight times.

    signals:   503   503 503(same event)          ok ok ok ... ok
    window:  32 -> 16 ------------------------ -> 17 (after 16 oks) -> 18 ...
    pause:     [- 0.05 s -]
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CongestionSettings:
    max_window: int = 32
    min_window: int = 1
    # Measured, not guessed (docs/benchmarks.md, benchmarks/throttle.py): 0.2 s
    # and 0.5 s paused every request for longer than botocore's own retries.
    backoff: float = 0.05  # seconds of the first shared pause
    max_backoff: float = 20.0
    cooldown: float = 0.1  # signals within this many seconds are one event
    max_probe_rounds: int = 32

    def __post_init__(self) -> None:
        if not 1 <= self.min_window <= self.max_window:
            raise ValueError("congestion: expected 1 <= min_window <= max_window, got "
                             f"{self.min_window}, {self.max_window}")
        if not 0 < self.backoff <= self.max_backoff or self.cooldown < 0:
            raise ValueError("congestion: expected 0 < backoff <= max_backoff, cooldown >= 0")


@dataclass
class Congestion:
    """The shared state; every method takes `now` (monotonic seconds)."""

    settings: CongestionSettings = field(default_factory=CongestionSettings)
    window: int = 0  # 0: start at max_window
    pause_until: float = 0.0
    #: Congestion events (decreases) and raw signals seen, for metrics.
    events: int = 0
    signals: int = 0
    lowest_window: int = 0
    _next_backoff: float = 0.0
    _pause: float = 0.0
    _last_event: float | None = None
    _successes: int = 0
    _ceiling: int | None = None
    _probe_rounds: int = 1

    def __post_init__(self) -> None:
        if self.window <= 0:
            self.window = self.settings.max_window
        self.lowest_window = self.window
        self._next_backoff = self.settings.backoff

    def may_start(self, in_flight: int, now: float) -> bool:
        """Whether one more request may start now."""
        return now >= self.pause_until and in_flight < self.window

    def wait_hint(self, now: float) -> float:
        """Seconds until the pause ends (0 when none): how long a waiter may sleep."""
        return max(0.0, self.pause_until - now)

    def on_congestion(self, now: float, jitter: float = 1.0,
                      in_flight: int | None = None) -> bool:
        """The store said slow down (503 SlowDown, 429, a timeout). `jitter`
        in [0.5, 1] scales the pause; `in_flight`, the requests out when the
        answer came (this one included), is what is halved when fewer than
        the window: halving a window of 32 that 8 workers never fill would
        slow nothing down. True if this began a new event."""
        s = self.settings
        self.signals += 1
        self._successes = 0
        new_event = self._last_event is None or now - self._last_event >= s.cooldown
        if new_event:
            self._last_event = now
            self.events += 1
            used = self.window if in_flight is None else min(self.window, max(1, in_flight))
            if self._ceiling is not None and abs(used - self._ceiling) <= 1:
                self._probe_rounds = min(s.max_probe_rounds, self._probe_rounds * 2)
            else:
                self._probe_rounds = 1
            self._ceiling = used
            self.window = max(s.min_window, used // 2)
            self.lowest_window = min(self.lowest_window, self.window)
            self._pause = self._next_backoff
            self._next_backoff = min(s.max_backoff, self._next_backoff * 2)
        # Every signal, not only an event's first, waits out a pause: a
        # request throttled again must not retry at once.
        pause = self._pause * min(1.0, max(0.5, jitter))
        self.pause_until = max(self.pause_until, now + pause)
        return new_event

    def on_success(self, now: float) -> None:
        """A request was answered normally: the back-off resets and, once per
        `window` successes, the window grows by one."""
        del now  # successes need no time; kept for a uniform call shape
        self._next_backoff = self.settings.backoff
        self._successes += 1
        near_ceiling = self._ceiling is not None and self.window + 1 >= self._ceiling
        if self._successes >= self.window * (self._probe_rounds if near_ceiling else 1):
            self._successes = 0
            self.window = min(self.settings.max_window, self.window + 1)
            if self._ceiling is not None and self.window > self._ceiling:
                self._ceiling, self._probe_rounds = None, 1  # more capacity than before
