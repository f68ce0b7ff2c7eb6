"""The admission server's connection slots (admission/connection_slots.py)
without a server: who is closed for a new connection when every slot is
taken, and who never is. Over real sockets and TLS:
test_op_webhook_slow_connections.py."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from ckptdrain.operator.admission.connection_slots import (
    ConnectionSlots,
    Held,
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


def taking(slots: ConnectionSlots, name: str, closes: Closes) -> threading.Thread:
    """`name` taking a slot in a thread of its own (it may have to wait)."""
    thread = threading.Thread(target=slots.take, args=(name, closes.of(name)), daemon=True)
    thread.start()
    return thread


def test_the_one_closed_for_a_new_connection_has_awaited_its_headers_longest() -> None:
    first, second = Held(lambda: None, 1), Held(lambda: None, 2)
    answering = Held(lambda: None, None)
    assert longest_awaiting([second, answering, first]) is first
    first.closed = True  # already closed for another: its release is due
    assert longest_awaiting([second, answering, first]) is second
    assert longest_awaiting([answering]) is None
    assert longest_awaiting([]) is None


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


def test_with_every_headers_in_a_new_connection_waits_and_closes_none() -> None:
    """Then it takes the place of the first kept alive to await its next
    request, or the first released; one closed at a time."""
    slots, closes = ConnectionSlots(2), Closes()
    for name in "ab":
        slots.take(name, closes.of(name))
        slots.headers_in(name)
    newcomer = taking(slots, "c", closes)
    newcomer.join(0.2)
    assert newcomer.is_alive() and closes.closed == []
    slots.awaiting_headers("b")  # answered, kept alive
    assert closes.wait_for(1) == ["b"]
    slots.awaiting_headers("a")  # b's release is due: a is not closed as well
    newcomer.join(0.2)
    assert newcomer.is_alive() and closes.closed == ["b"]
    slots.release("b")
    newcomer.join(10)
    assert not newcomer.is_alive() and len(slots) == 2


def test_a_connection_awaiting_again_is_the_newest_to_await() -> None:
    slots, closes = ConnectionSlots(2), Closes()
    slots.take("a", closes.of("a"))
    slots.take("b", closes.of("b"))
    slots.headers_in("a")
    slots.awaiting_headers("a")  # after b began awaiting its headers
    newcomer = taking(slots, "c", closes)
    assert closes.wait_for(1) == ["b"]
    slots.release("b")
    newcomer.join(10)
    assert not newcomer.is_alive()


def test_no_slots_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="capacity: expected at least 1 connection, got 0"):
        ConnectionSlots(0)
