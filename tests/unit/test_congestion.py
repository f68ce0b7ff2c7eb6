"""The shared AIMD back-off (congestion.py): pure, with the clock given."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.congestion import Congestion, CongestionSettings

S = CongestionSettings(max_window=32, min_window=1, backoff=0.2, max_backoff=20.0, cooldown=0.5)


def test_a_signal_halves_the_window_and_pauses_every_new_request() -> None:
    c = Congestion(S)
    assert c.may_start(31, now=0.0) and not c.may_start(32, now=0.0)
    assert c.on_congestion(10.0) is True
    assert c.window == 16
    assert not c.may_start(0, now=10.1)  # paused: nobody starts, whatever is in flight
    assert c.may_start(15, now=10.2) and not c.may_start(16, now=10.2)


def test_signals_within_the_cooldown_are_one_event_but_each_waits_a_pause() -> None:
    c = Congestion(S)
    for _ in range(8):  # eight requests in flight all answered 503 at once
        c.on_congestion(10.0)
    assert (c.window, c.events, c.signals) == (16, 1, 8)
    c.on_congestion(10.3)  # a retry throttled again, still the same event
    assert c.events == 1 and not c.may_start(0, now=10.4)


def test_consecutive_events_double_the_pause_up_to_the_cap() -> None:
    c = Congestion(S)
    pauses = []
    now = 0.0
    for _ in range(10):
        now += 100.0
        c.on_congestion(now)
        pauses.append(round(c.pause_until - now, 3))
    assert pauses[:4] == [0.2, 0.4, 0.8, 1.6]
    assert max(pauses) == 20.0
    assert c.window == 1  # never below min_window


def test_a_success_resets_the_pause_and_successes_grow_the_window_by_one_per_round() -> None:
    c = Congestion(S)
    c.on_congestion(0.0)
    c.on_congestion(1.0)
    assert c.window == 8
    c.on_success(2.0)
    c.on_congestion(3.0)
    assert round(c.pause_until - 3.0, 3) == 0.2  # back to the first pause
    assert c.window == 4
    for _ in range(4):
        c.on_success(4.0)
    assert c.window == 5  # one round of 4 answers: +1
    for _ in range(1000):
        c.on_success(5.0)
    assert c.window == 32  # recovered, capped at max_window


def test_jitter_shortens_a_pause_at_most_by_half() -> None:
    c = Congestion(S)
    c.on_congestion(0.0, jitter=0.0)
    assert round(c.pause_until, 3) == 0.1


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 5)), max_size=300))
def test_the_window_stays_within_its_bounds(events: list[tuple[bool, float]]) -> None:
    c, now = Congestion(S), 0.0
    for congested, dt in events:
        now += dt
        if congested:
            c.on_congestion(now)
        else:
            c.on_success(now)
        assert S.min_window <= c.window <= S.max_window
        assert c.lowest_window <= c.window


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="min_window"):
        CongestionSettings(max_window=2, min_window=3)
    with pytest.raises(ValueError, match="backoff"):
        CongestionSettings(backoff=0)


def test_a_window_larger_than_what_is_used_halves_what_is_in_flight() -> None:
    c = Congestion(S)  # window 32, but only 8 workers send
    c.on_congestion(0.0, in_flight=8)
    assert c.window == 4  # halving 32 to 16 would not have slowed 8 workers at all
    c.on_congestion(100.0, in_flight=20)
    assert c.window == 2  # never more than half the window itself


def _regrow(c: Congestion, to: int) -> int:
    """Successes it takes the window to reach `to`."""
    n = 0
    while c.window < to:
        c.on_success(0.0)
        n += 1
    return n


def test_a_store_that_complains_at_the_same_level_is_probed_ever_less_often() -> None:
    c, now, costs = Congestion(S), 0.0, []
    for _ in range(5):  # a hard limit: 4 in flight is always one too many
        now += 100.0
        c.on_congestion(now, in_flight=4)
        assert c.window == 2
        costs.append(_regrow(c, 4))
    assert costs[1] > costs[0] and costs[2] > costs[1] and costs[4] >= 2 * costs[2]


def test_growing_past_the_ceiling_forgets_it() -> None:
    c = Congestion(S)
    c.on_congestion(0.0, in_flight=4)
    assert _regrow(c, 5) > 2 + 3  # slow near the ceiling, then past it: forgotten
    assert _regrow(c, 20) == sum(range(5, 20))  # plain additive increase again
    c.on_congestion(100.0, in_flight=10)
    assert c.window == 5
    assert _regrow(c, 9) == 5 + 6 + 7 + 8  # plain additive increase again
