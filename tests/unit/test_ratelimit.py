"""The shared token bucket, on a fake clock: mean rate, worst window, rate changes."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptdrain.ratelimit import TokenBucket


class FakeTime:
    """A clock that moves only when someone sleeps; records (time, granted)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.samples: list[tuple[float, int]] = []
        self.bucket: TokenBucket | None = None
        self.on_sleep: list = []
        self._lock = threading.Lock()

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        with self._lock:
            assert self.bucket is not None
            self.samples.append((self.now, self.bucket.granted))
            self.now += seconds
            for hook in self.on_sleep:
                hook(self.now)


def make(rate: float | None) -> tuple[TokenBucket, FakeTime]:
    t = FakeTime()
    bucket = TokenBucket(rate, clock=t.clock, sleep=t.sleep)
    t.bucket = bucket
    return bucket, t


def worst_window(samples: list[tuple[float, int]], width: float = 1.0) -> float:
    """Most bytes granted in any window of `width` seconds (from the samples)."""
    worst = 0
    j = 0
    for i in range(len(samples)):
        t_end, g_end = samples[i]
        while samples[j][0] < t_end - width:
            j += 1
        # Bytes granted after the sample just before the window opened.
        g_start = samples[j - 1][1] if j > 0 else 0
        worst = max(worst, g_end - g_start)
    return worst


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(min_value=2e6, max_value=5e9),
    # Request sizes as seconds of rate keep the simulated run short.
    spans=st.lists(st.floats(min_value=1e-6, max_value=3.0), min_size=1, max_size=20),
)
def test_mean_rate_and_worst_window(rate: float, spans: list[float]) -> None:
    sizes = [max(1, int(s * rate)) for s in spans]
    bucket, t = make(rate)
    for n in sizes:
        assert bucket.acquire(n)
    total = sum(sizes)
    assert bucket.granted == total
    t.samples.append((t.now, bucket.granted))
    # Starts empty and never idles: elapsed time is the bytes over the rate,
    # less at most one slice granted from the last refill.
    expected = total / rate
    assert t.now <= expected + 1e-6
    assert t.now >= expected - max(0.011, 64 * 1024 / rate)
    if expected >= 2:
        assert worst_window(t.samples) <= rate * 1.05


def test_unlimited_never_sleeps() -> None:
    bucket, t = make(None)
    assert bucket.acquire(10 << 30)
    assert t.now == 0 and bucket.granted == 10 << 30


def test_rate_change_reaches_a_blocked_waiter_quickly() -> None:
    bucket, t = make(10e6)
    changed_at: list[float] = []

    def lower_at_5s(now: float) -> None:
        if now >= 5 and not changed_at:
            bucket.set_rate(1e6)
            changed_at.append(now)

    t.on_sleep.append(lower_at_5s)
    assert bucket.acquire(60_000_000)  # one call, blocked across the change
    t.samples.append((t.now, bucket.granted))
    after = [(s, g) for s, g in t.samples if s >= changed_at[0] + 0.2]
    rate_after = (after[-1][1] - after[0][1]) / (after[-1][0] - after[0][0])
    assert rate_after == pytest.approx(1e6, rel=0.02)
    first_gap = min(s for s, _ in t.samples if s > changed_at[0]) - changed_at[0]
    assert first_gap <= 0.1 + 1e-9


def test_rate_raise_and_unlimit_take_effect() -> None:
    bucket, t = make(1e6)

    def unlimit_at_2s(now: float) -> None:
        if now >= 2 and bucket.rate is not None:
            bucket.set_rate(None)

    t.on_sleep.append(unlimit_at_2s)
    assert bucket.acquire(1 << 30)
    assert t.now < 2.2  # a GiB at 1 MB/s would have taken 1000 s


def test_stop_interrupts_a_wait() -> None:
    bucket, t = make(1e6)
    assert not bucket.acquire(100_000_000, should_stop=lambda: t.now > 3)
    assert 3 < t.now < 3.2
    assert bucket.granted < 4_000_000


def test_threads_share_one_rate() -> None:
    bucket, t = make(50e6)
    per_thread, threads = 20_000_000, 4

    def send() -> None:
        assert bucket.acquire(per_thread)

    workers = [threading.Thread(target=send) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert bucket.granted == per_thread * threads
    # Fake sleeps from several threads add up, so time can only run ahead of
    # the rate, never behind it: the aggregate never exceeds the rate.
    assert t.now >= per_thread * threads / 50e6 - 0.011


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_bad_rate_refused(bad: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(bad)


@settings(max_examples=40, deadline=None)
@given(
    rate=st.floats(min_value=2e6, max_value=5e9),
    steps=st.lists(
        st.tuples(st.floats(0, 3.0), st.floats(1e-6, 2.0)),  # (idle s, request as s of rate)
        min_size=2,
        max_size=15,
    ),
)
def test_idle_gaps_never_buy_a_burst(rate: float, steps: list[tuple[float, float]]) -> None:
    """Tokens saved while idle are capped, so no 1 s window exceeds the rate by > 5%."""
    bucket, t = make(rate)
    for idle, span in steps:
        t.samples.append((t.now, bucket.granted))
        t.now += idle
        assert bucket.acquire(max(1, int(span * rate)))
        t.samples.append((t.now, bucket.granted))
    assert worst_window(t.samples) <= rate * 1.05
