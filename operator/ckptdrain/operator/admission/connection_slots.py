"""The admission server's connection slots (admission/server.py): at most
`capacity` connections held at once, and who gives one up when all are
taken and another connection arrives.

A connection is *awaiting headers* from when it takes its slot until its
request line and headers are in (its TLS handshake included), and again
while a kept-alive connection waits for its next request. One that is
awaiting headers costs its client nothing to hold, so when every slot is
taken the one that has awaited its headers longest is closed (`close`, its
thread then ends and releases the slot) and the new connection takes its
place: a client that sends its headers at once (the apiserver does) gets in
unless `capacity` connections arrive while it sends them. A connection
whose headers are in (its body arriving within the review's bounds, or its
answer being made) is never closed here; with none awaiting headers, the
next connection waits for a release, and those after it in the listen
backlog.

How long a connection may await its headers, and how it is closed from
another thread: admission/connection.py.

Pure but for the lock: no clock (the order connections began awaiting
their headers is a count), no sockets (`close` is the caller's)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass


@dataclass
class Held:
    """One connection's slot. `awaiting` orders those awaiting their
    headers (the lowest has awaited longest); None: its headers are in."""
    close: Callable[[], None]
    awaiting: int | None
    closed: bool = False  # closed for a new connection; its release is due


def longest_awaiting(held: Iterable[Held]) -> Held | None:
    """The connection to close for a new one: of those awaiting their
    headers and not yet closed, the one that has awaited longest; None when
    there is none (every connection's headers are in)."""
    candidates = [h for h in held if h.awaiting is not None and not h.closed]
    return min(candidates, key=lambda h: h.awaiting or 0, default=None)


class ConnectionSlots:
    """At most `capacity` connections, each held from `take` to `release`."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: expected at least 1 connection, got {capacity}")
        self.capacity = capacity
        self._held: dict[Hashable, Held] = {}
        self._order = itertools.count()
        self._changed = threading.Condition()

    def take(self, connection: Hashable, close: Callable[[], None]) -> None:
        """A slot for `connection`, awaiting its headers. When all are taken,
        closes the connection longest awaiting its headers (at most one
        closed and not yet released at a time) and waits for a release."""
        with self._changed:
            while len(self._held) >= self.capacity:
                if not any(h.closed for h in self._held.values()):
                    victim = longest_awaiting(self._held.values())
                    if victim is not None:
                        victim.closed = True
                        victim.close()  # under the lock: its release cannot have run
                self._changed.wait()
            self._held[connection] = Held(close, next(self._order))

    def headers_in(self, connection: Hashable) -> None:
        """`connection`'s request line and headers are in: never closed here
        until it awaits its next request's (`awaiting_headers`)."""
        with self._changed:
            held = self._held.get(connection)
            if held is not None:
                held.awaiting = None

    def awaiting_headers(self, connection: Hashable) -> None:
        """`connection` (kept alive) awaits its next request: the newest to
        await, and closed for a new connection like any other awaiting."""
        with self._changed:
            held = self._held.get(connection)
            if held is not None and held.awaiting is None:
                held.awaiting = next(self._order)
                self._changed.notify_all()  # a connection waiting may now take its place

    def release(self, connection: Hashable) -> None:
        """`connection` gives its slot back. Called before its socket is
        closed, so that `close` never reaches a socket already closed (whose
        descriptor a new connection may have been given)."""
        with self._changed:
            if self._held.pop(connection, None) is not None:
                self._changed.notify_all()

    def __len__(self) -> int:
        with self._changed:
            return len(self._held)
