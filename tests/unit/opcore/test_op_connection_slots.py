"""The admission server's connection slots (admission/connection_slots.py)
without a server: who is closed for a new connection when every slot is
taken, and who never is. Over real sockets and TLS:
test_op_webhook_slow_connections.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from ckptdrain.operator.admission.connection_slots import (
    ConnectionSlots,
    Held,
    Slots,
    longest_awaiting,
)


class Closes:
    """The `close` given with each connection: records which were closed."""

    def __init__(self) -> None:
        self.closed: list[str] = []
        self.changed = threading.Condition()

    def of(self, name: str) -> Callable[[], None]:
        def close() -> None:
            with self.changed:
                self.closed.append(name)
                self.changed.notify_all()
        return close

    def wait_for(self, count: int) -> list[str]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.closed) >= count, 10), self.closed
            return list(self.closed)


def headers_read(slots: ConnectionSlots, closes: Closes, names: str) -> None:
    """Each of `names` takes a slot and has its headers read."""
    for name in names:
        slots.take(name, closes.of(name))
        slots.headers_in(name)


def taking(slots: ConnectionSlots, name: str, closes: Closes) -> threading.Thread:
    """`name` taking a slot in a thread of its own (it may have to wait)."""
    thread = threading.Thread(target=slots.take, args=(name, closes.of(name)), daemon=True)
    thread.start()
    return thread


def test_the_one_closed_for_a_new_connection_has_awaited_its_headers_longest() -> None:
    first, second = Held(lambda: None, 1), Held(lambda: None, 2)
    answering = Held(lambda: None, None)
    kept_alive = Held(lambda: None, 0, closable_at=5.0)  # in its grace until 5
    assert longest_awaiting([second, answering, first, kept_alive], now=1.0) is first
    assert longest_awaiting([second, answering, first, kept_alive], now=5.0) is kept_alive
    first.closed = True  # already closed for another: its release is due
    assert longest_awaiting([second, answering, first], now=1.0) is second
    assert longest_awaiting([answering], now=1.0) is None
    assert longest_awaiting([], now=1.0) is None


def test_slots_up_to_capacity_close_nothing() -> None:
    slots, closes = ConnectionSlots(3), Closes()
    for name in "abc":
        slots.take(name, closes.of(name))
    assert len(slots) == 3 and closes.closed == []
    slots.release("b")
    slots.release("b")  # twice (the server's socket ending twice): no harm
    slots.take("d", closes.of("d"))
    assert len(slots) == 3 and closes.closed == []


def test_a_new_connection_takes_the_place_of_the_longest_awaiting_headers() -> None:
    """a's headers are in (being answered); b, then c, await theirs: d
    closes b, and takes its slot once b's thread releases it."""
    slots, closes = ConnectionSlots(3), Closes()
    for name in "abc":
        slots.take(name, closes.of(name))
    slots.headers_in("a")
    newcomer = taking(slots, "d", closes)
    assert closes.wait_for(1) == ["b"]
    assert newcomer.is_alive()  # b still holds its slot until it releases it
    slots.release("b")
    newcomer.join(10)
    assert not newcomer.is_alive() and len(slots) == 3
    # The next: c has now awaited longest (d came after it).
    newcomer = taking(slots, "e", closes)
    assert closes.wait_for(2) == ["b", "c"]
    slots.release("c")
    newcomer.join(10)
    assert not newcomer.is_alive()


def until_waiting(slots: ConnectionSlots) -> None:
    """Until a new connection waits for a slot: it has found none to close."""
    deadline = time.monotonic() + 10  # a thread starting, not a bound on `take`
    while not slots.waiting:
        assert time.monotonic() < deadline, "no connection waited for a slot in 10 s"
        time.sleep(0.01)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_with_every_headers_in_a_new_connection_waits_and_closes_none() -> None:
    """Then it takes the place of the first kept alive once its grace is
    over, or the first released; one closed at a time."""
    clock = Clock()
    slots, closes = ConnectionSlots(2, clock), Closes()
    headers_read(slots, closes, "ab")
    newcomer = taking(slots, "c", closes)
    until_waiting(slots)
    assert closes.closed == []
    slots.awaiting_next("b", grace=0.0)  # answered, kept alive, no grace
    assert closes.wait_for(1) == ["b"]
    slots.awaiting_next("a", grace=0.0)  # b's release is due: a is not closed as well
    assert slots.waiting and closes.closed == ["b"]
    slots.release("b")
    newcomer.join(10)
    assert not newcomer.is_alive() and len(slots) == 2 and not slots.waiting
    assert closes.closed == ["b"]


def test_a_kept_alive_connection_is_not_closed_within_its_grace() -> None:
    """Its client may be sending its next request: a new connection waits
    out the grace, and then closes it."""
    clock = Clock()
    slots, closes = ConnectionSlots(2, clock), Closes()
    headers_read(slots, closes, "ab")
    slots.awaiting_next("a", grace=60.0)
    newcomer = taking(slots, "c", closes)
    until_waiting(slots)  # found none to close: a is in its grace
    assert closes.closed == []
    clock.now = 61.0
    slots.awaiting_next("b", grace=60.0)  # wakes the newcomer: a's grace is over, b's not
    assert closes.wait_for(1) == ["a"]
    slots.release("a")
    newcomer.join(10)
    assert not newcomer.is_alive() and closes.closed == ["a"]


def test_a_new_connection_waiting_out_a_grace_wakes_when_it_ends() -> None:
    """No release or other change needed: the grace's end is waited for."""
    slots, closes = ConnectionSlots(1), Closes()
    slots.take("a", closes.of("a"))
    slots.headers_in("a")
    slots.awaiting_next("a", grace=0.05)
    newcomer = taking(slots, "b", closes)
    assert closes.wait_for(1) == ["a"]
    slots.release("a")
    newcomer.join(10)
    assert not newcomer.is_alive()


def test_headers_in_says_whether_the_connection_was_closed_for_another() -> None:
    slots, closes = ConnectionSlots(1), Closes()
    slots.take("a", closes.of("a"))
    newcomer = taking(slots, "b", closes)
    assert closes.wait_for(1) == ["a"]
    assert slots.headers_in("a") is False  # its request is not to be answered
    slots.release("a")
    newcomer.join(10)
    assert slots.headers_in("b") is True


def test_a_connection_awaiting_again_is_the_newest_to_await() -> None:
    slots, closes = ConnectionSlots(2), Closes()
    slots.take("a", closes.of("a"))
    slots.take("b", closes.of("b"))
    slots.headers_in("a")
    slots.awaiting_next("a", grace=0.0)  # after b began awaiting its headers
    newcomer = taking(slots, "c", closes)
    assert closes.wait_for(1) == ["b"]
    slots.release("b")
    newcomer.join(10)
    assert not newcomer.is_alive()


def test_no_slots_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="capacity: expected at least 1 connection, got 0"):
        ConnectionSlots(0)


def test_a_body_is_closed_for_a_new_connection_only_once_behind_its_pace() -> None:
    """a's body keeps its pace (each piece puts its `behind_at` off), b's
    body is in: a new connection waits, and closes a once a falls behind;
    a's reading then says it was closed (not to be answered)."""
    clock = Clock()
    slots, closes = ConnectionSlots(2, clock), Closes()
    headers_read(slots, closes, "ab")
    slots.reading_body("a", behind_at=1.0)
    slots.reading_body("b", behind_at=1.0)
    assert slots.body_in("b") is True  # all in: never closed here
    newcomer = taking(slots, "c", closes)
    until_waiting(slots)
    clock.now = 0.9
    slots.reading_body("a", behind_at=2.0)  # a piece came: still within its pace
    clock.now = 1.5
    slots.awaiting_next("b", grace=60.0)  # wakes the newcomer: a keeps pace, b in its grace
    time.sleep(0.05)
    assert closes.closed == []
    # Released before a falls behind: the newcomer's own timed wake (real
    # seconds, however late on a loaded machine) finds no one to close.
    slots.release("b")
    newcomer.join(10)
    assert not newcomer.is_alive() and closes.closed == []  # a release: none closed
    slots.headers_in("c")  # else c, awaiting its headers, goes before a's body
    clock.now = 2.0
    slots.reading_body("a", behind_at=2.0)  # no piece since: behind
    newcomer = taking(slots, "d", closes)
    assert closes.wait_for(1) == ["a"]
    assert slots.body_in("a") is False
    slots.release("a")
    newcomer.join(10)
    assert not newcomer.is_alive()


def test_a_new_connection_is_not_closed_for_another_within_its_settle() -> None:
    """However fast new connections come: the next waits out a's settle
    (no release or other change needed), and then closes it."""
    clock = Clock()
    slots, closes = ConnectionSlots(1, clock, settle=0.2), Closes()
    slots.take("a", closes.of("a"))
    newcomer = taking(slots, "b", closes)
    until_waiting(slots)
    assert closes.closed == []
    clock.now = 0.2
    assert closes.wait_for(1) == ["a"]
    slots.release("a")
    newcomer.join(10)
    assert not newcomer.is_alive()


def test_a_connection_waiting_for_a_body_slot_stops_as_it_is_closed() -> None:
    """a waits for the one body slot, b holds it: a newcomer closes a
    (behind its pace), and a's wait ends then, not at a next look or its
    timeout; b's never does. A slot released more often than taken is a bug."""
    clock = Clock()
    slots, closes = ConnectionSlots(2, clock), Closes()
    bodies = Slots(slots, 1)
    headers_read(slots, closes, "ab")
    assert bodies.acquire(connection="b") is True
    assert bodies.acquire(timeout=0.01, connection="a") is False
    slots.reading_body("a", behind_at=0.0)
    waited: list[bool | None] = []
    waiter = threading.Thread(target=lambda: waited.append(
        bodies.acquire(timeout=600, connection="a")), daemon=True)
    waiter.start()
    newcomer = taking(slots, "c", closes)
    waiter.join(10)
    assert not waiter.is_alive() and waited == [None] and closes.closed == ["a"]
    slots.release("a")
    newcomer.join(10)
    bodies.release()
    assert bodies.acquire(blocking=False, connection="a") is True  # a is gone: not closed
    bodies.release()
    with pytest.raises(ValueError, match="released more often than taken"):
        bodies.release()


def test_a_body_behind_or_awaiting_its_slot_is_closed_only_after_the_others() -> None:
    """a's body began first and fell behind (as one awaiting its body slot
    does from its headers): still, a newcomer closes b, idle past its grace,
    then c, awaiting its headers, and a only when none of those is left."""
    clock = Clock()
    slots, closes = ConnectionSlots(3, clock), Closes()
    headers_read(slots, closes, "ab")
    slots.reading_body("a", behind_at=0.5)
    slots.awaiting_next("b", grace=1.0)
    slots.take("c", closes.of("c"))
    clock.now = 1.5
    for count, newcomer_name in enumerate("def", start=1):
        newcomer = taking(slots, newcomer_name, closes)
        closed = closes.wait_for(count)
        slots.release(closed[-1])
        newcomer.join(10)
        assert not newcomer.is_alive()
        slots.headers_in(newcomer_name)
    assert closes.closed == ["b", "c", "a"]


def test_a_body_given_its_slot_keeps_its_pace_from_then() -> None:
    """a awaited its body's slot past its pace: handed the slot at 10, it
    is not closable for a newcomer until its pace, counted from then, ends."""
    clock = Clock()
    slots, closes = ConnectionSlots(2, clock), Closes()
    bodies = Slots(slots, 1)
    headers_read(slots, closes, "ab")
    assert bodies.acquire(connection="b") is True
    slots.reading_body("a", behind_at=0.5)
    slots.body_in("b")
    clock.now = 10.0
    bodies.release()
    assert bodies.acquire(timeout=0, connection="a", behind_after=0.5) is True
    newcomer = taking(slots, "c", closes)
    until_waiting(slots)
    assert closes.closed == []
    clock.now = 10.5
    slots.awaiting_next("b", grace=60.0)  # wakes the newcomer: a's pace is over
    assert closes.wait_for(1) == ["a"]
    slots.release("a")
    newcomer.join(10)
    assert not newcomer.is_alive()
    bodies.release()


def in_line(bodies: Slots, count: int) -> None:
    """Until `count` connections wait in line for one of `bodies`."""
    deadline = time.monotonic() + 10
    while len(bodies._line) < count:
        assert time.monotonic() < deadline, "the waiters did not line up in 10 s"
        time.sleep(0.01)


def waiter(bodies: Slots, name: str, got: list[tuple[str, bool | None]]) -> threading.Thread:
    thread = threading.Thread(target=lambda: got.append(
        (name, bodies.acquire(timeout=600, connection=name))), daemon=True)
    thread.start()
    return thread


def lined_up(names: str) -> tuple[ConnectionSlots, Slots, list[tuple[str, bool | None]],
                                  list[threading.Thread]]:
    """x holds the one slot; `names` wait for it, in that order."""
    slots = ConnectionSlots(len(names) + 2)
    bodies, got, threads = Slots(slots, 1), list[tuple[str, bool | None]](), []
    for name in "x" + names:
        slots.take(name, lambda: None)
    assert bodies.acquire(connection="x") is True
    for count, name in enumerate(names, start=1):
        threads.append(waiter(bodies, name, got))
        in_line(bodies, count)
    return slots, bodies, got, threads


def test_waiters_for_a_slot_are_served_in_the_order_they_came() -> None:
    _, bodies, got, (first, second) = lined_up("ab")
    bodies.release()
    first.join(10)
    assert got == [("a", True)] and second.is_alive()
    bodies.release()
    second.join(10)
    assert got == [("a", True), ("b", True)]
    bodies.release()


def test_the_first_closed_as_a_slot_came_free_hands_it_on_at_once() -> None:
    """The slot is freed for a, and a closed for a newcomer before it woke:
    b gets the slot then, not at its timeout."""
    slots, bodies, got, (first, second) = lined_up("ab")
    with slots._lock:
        bodies.release()  # a is woken for it...
        held = slots._held["a"]
        held.closed = True  # ...but closed first, as a newcomer's take does
        assert held.woken is not None
        held.woken.notify()
    first.join(10)
    second.join(10)
    assert got == [("a", None), ("b", True)]
    bodies.release()


def test_a_new_arrival_does_not_overtake_those_in_line() -> None:
    slots, bodies, got, (first,) = lined_up("a")
    with slots._lock:
        bodies.release()  # a is woken for it, and has not taken it yet
        assert bodies.acquire(blocking=False, connection="c") is False
    first.join(10)
    assert got == [("a", True)]
    bodies.release()
