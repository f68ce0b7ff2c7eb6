"""The admission server's connection slots (admission/server.py): at most
`capacity` connections held at once, and who gives one up when all are
taken and another connection arrives.

A connection is *awaiting headers* from when it takes its slot until its
first request's line and headers are in (its TLS handshake included). One
that is awaiting them costs its client nothing to hold, so when every slot
is taken the one that has awaited its headers longest is closed (`close`,
its thread then ends and releases the slot) and the new connection takes
its place. Not within `settle` seconds of its taking the slot, though:
a client that sends its headers at once (the apiserver does) gets in
however fast new connections come, and they wait for one older (or a
release) meanwhile. Without that, clients reopening a connection as fast
as theirs are closed (trickling bodies, below, or sending nothing) would
close each valid one as its handshake began, once none older was left.

A kept-alive connection awaiting its next request is *idle*. Its client may
be writing that request the moment it was answered (Go's transport reuses a
connection at once for a queued request, and does not send a POST again
once written), so it is closed for a new connection only once it has been
idle `grace` seconds (`awaiting_next`): from then on it is as any server's
idle connection, whose close may cross a request the client has begun.
While a new connection waits for a slot, the server answers with
`Connection: close` (`waiting`), so a client done with its answer opens a
new connection rather than reusing one that may be closed under it.

A connection whose body is arriving is closed for a new connection like
one awaiting headers, but only while its body is behind the least pace,
and only when no connection awaiting headers or idle is closable
(`reading_body`, told as its bytes come: admission/body.py), so a client
trickling a body in does not hold its slot for another. One whose body is
in (its answer being made), or is keeping pace, is never closed here; with
none to close, the next connection waits for a release, and those after it
in the listen backlog. `headers_in` says whether the connection was
already closed for another (its headers arrived as it was closed), and
`body_in` likewise for its body: its request is then not answered. The
window that remains: a connection closed after its client sent the last
header line (or fell behind with its body, then sent the rest) but before
the server read it.

How long a connection may await its headers, and how it is closed from
another thread: admission/connection.py.

Pure but for the lock and the clock (given: `clock`); no sockets (`close`
is the caller's)."""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass


@dataclass
class Held:
    """One connection's slot. `awaiting` orders those that may be closed
    for a new connection (the lowest has awaited longest); None: its
    headers, or its body, are in. `closable_at`: not before this (a
    kept-alive connection's grace, a body's pace, a new connection's
    `settle`)."""
    close: Callable[[], None]
    awaiting: int | None
    closable_at: float = 0.0
    closed: bool = False  # closed for a new connection; its release is due
    #: Its body is arriving (or awaits its slot): closed only when no
    #: connection awaiting headers, or idle, is closable.
    body: bool = False
    #: Wakes it while it waits for a body's slot (Slots), to end that wait.
    woken: threading.Condition | None = None


def longest_awaiting(held: Iterable[Held], now: float) -> Held | None:
    """The connection to close for a new one: of those awaiting, closable by
    `now` and not yet closed, the one that has awaited longest, a body only
    when there is no other (a valid large body awaiting its slot falls
    behind its pace from its headers on: it is not closed before connections
    that cost their client nothing to hold); None when there is none."""
    candidates = [h for h in held
                  if h.awaiting is not None and not h.closed and h.closable_at <= now]
    return min(candidates, key=lambda h: (h.body, h.awaiting or 0), default=None)


def next_closable(held: Iterable[Held], now: float) -> float | None:
    """Seconds until the first connection awaiting becomes closable; None:
    none is awaiting that is not yet."""
    graces = [h.closable_at - now for h in held
              if h.awaiting is not None and not h.closed and h.closable_at > now]
    return min(graces, default=None)


class ConnectionSlots:
    """At most `capacity` connections, each held from `take` to `release`;
    none closed for another within `settle` seconds of its `take`."""

    def __init__(self, capacity: int, clock: Callable[[], float] = time.monotonic,
                 settle: float = 0.0) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: expected at least 1 connection, got {capacity}")
        self.capacity, self.clock, self.settle = capacity, clock, settle
        self._held: dict[Hashable, Held] = {}
        self._order = itertools.count()
        self._waiting = 0
        #: One lock for the slots and the Slots counted under it (below).
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)

    def take(self, connection: Hashable, close: Callable[[], None]) -> None:
        """A slot for `connection`, awaiting its headers. When all are taken,
        closes the connection longest awaiting headers (or behind with its
        body) and closable by now (at most one closed and not yet released
        at a time; with none, waits until one is), and waits for a release."""
        with self._changed:
            while len(self._held) >= self.capacity:
                timeout = None
                if not any(h.closed for h in self._held.values()):
                    now = self.clock()
                    victim = longest_awaiting(self._held.values(), now)
                    if victim is not None:
                        victim.closed = True
                        victim.close()  # under the lock: its release cannot have run
                        if victim.woken is not None:  # it waits for a body's slot
                            victim.woken.notify()
                    else:  # wake when a grace or settle ends, or a body falls behind
                        timeout = next_closable(self._held.values(), now)
                self._waiting += 1
                try:
                    self._changed.wait(timeout)
                finally:
                    self._waiting -= 1
            self._held[connection] = Held(close, next(self._order),
                                          closable_at=self.clock() + self.settle)

    @property
    def waiting(self) -> bool:
        """Whether a new connection waits for a slot: answers then close
        their connection rather than keep it for the client's next request."""
        with self._changed:
            return self._waiting > 0

    def headers_in(self, connection: Hashable) -> bool:
        """`connection`'s request line and headers are in: never closed here
        until it is idle again (`awaiting_next`). False: it was closed for a
        new connection before they were (its request is not to be answered)."""
        with self._changed:
            held = self._held.get(connection)
            if held is None:
                return True
            held.awaiting, held.body = None, False
            return not held.closed

    def reading_body(self, connection: Hashable, behind_at: float) -> None:
        """`connection`'s body is arriving, and falls behind its pace at
        `behind_at` (later as its bytes come): from then on it may be closed
        for a new connection, in the order it began to arrive."""
        with self._changed:
            held = self._held.get(connection)
            if held is None:
                return
            held.closable_at, held.body = behind_at, True
            if held.awaiting is None:
                held.awaiting = next(self._order)
                # A connection waiting may time its wake; later updates only
                # put `behind_at` off, and a wake too early waits again.
                self._changed.notify_all()

    def body_in(self, connection: Hashable) -> bool:
        """`connection`'s body is in (or its reading ended): never closed here
        until it is idle again. False: it was closed for a new connection
        first (its socket is shut; nothing is to be answered)."""
        return self.headers_in(connection)

    def awaiting_next(self, connection: Hashable, grace: float) -> None:
        """`connection` (kept alive) awaits its next request: the newest to
        await, closed for a new connection like any other awaiting, but not
        within `grace` seconds of now."""
        with self._changed:
            held = self._held.get(connection)
            if held is not None and held.awaiting is None:
                held.awaiting = next(self._order)
                held.closable_at = self.clock() + grace
                self._changed.notify_all()  # a connection waiting may time its wake

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


class Slots:
    """`count` slots held by connections of `connections` (server.py's body
    and conversion slots), counted under its lock and given in the order
    asked. A connection waiting for one is woken alone: by a release when
    it is first in line, or the moment it is closed for a new connection
    (not at a next look), so waiters make way as fast as connections
    awaiting headers, and no event wakes every waiter."""

    def __init__(self, connections: ConnectionSlots, count: int) -> None:
        self.count, self._free = count, count
        self._changed, self._held = connections._changed, connections._held
        self._lock, self._clock = connections._lock, connections.clock
        self._line: collections.deque[threading.Condition] = collections.deque()

    def acquire(self, blocking: bool = True, timeout: float | None = None,
                connection: Hashable | None = None,
                behind_after: float | None = None) -> bool | None:
        """One slot (True); False: none free within `timeout` (or at once,
        not `blocking`); None: `connection` was closed for a new one first.
        `behind_after`: `connection`'s body, none of it read, falls behind
        its pace this many seconds after it is handed the slot (set then,
        under the lock, so no newcomer finds it behind from its wait)."""
        with self._changed:
            held = self._held.get(connection) if connection is not None else None
            if held is not None and held.closed:
                return None
            if self._free and not self._line:
                return self._taken(held, behind_after)
            if not blocking:
                return False
            ends = None if timeout is None else time.monotonic() + timeout
            woken = threading.Condition(self._lock)  # the same lock, its own wake
            self._line.append(woken)
            if held is not None:
                held.woken = woken
            try:
                while True:
                    if held is not None and held.closed:
                        return None
                    if self._free and self._line[0] is woken:
                        return self._taken(held, behind_after)
                    left = None if ends is None else ends - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    woken.wait(left)
            finally:
                self._line.remove(woken)
                if held is not None:
                    held.woken = None
                if self._free and self._line:
                    self._line[0].notify()  # next in line, if it was passed a slot

    def _taken(self, held: Held | None, behind_after: float | None) -> bool:
        """A slot handed over, under the lock."""
        self._free -= 1
        if held is not None and behind_after is not None:
            held.closable_at = self._clock() + behind_after
        return True

    def release(self) -> None:
        with self._changed:
            if self._free >= self.count:
                raise ValueError("Slots released more often than taken")
            self._free += 1
            if self._line:
                self._line[0].notify()
