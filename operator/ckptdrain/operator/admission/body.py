"""A review's body, read once its headers are in (admission/server.py's
Handler): all of it due by a deadline that grows with its announced
length, and while it arrives, a pace it must keep for its connection not
to be closed for a new one when every slot is taken
(admission/connection_slots.py).

The apiserver writes a review's body right after its headers, from memory
(a few KiB to a few MiB; the server caps it), so a body is due within
BODY_S of its reading's start (its headers, or its taking a large body's
slot) plus its length at MIN_BODY_RATE, never later than the review's own
deadline (its `?timeout=`, up to 30 s; a conversion's 30 s), which is
also how long a body awaits its slot. A client that sends its headers at
once and its body a byte at a time thus holds its connection slot BODY_S,
not the 30 s a review may ask.

The pace: from when its reading begins, a body is *behind* once fewer of
its bytes are in than MIN_BODY_RATE would have brought after BEHIND_S; one
waiting for a large body's slot (none read) is behind BEHIND_S after its
headers, and its reading, once it has the slot, begins a new count.
While it is, its connection is closed for a new one as one awaiting its
headers is, so that connections trickling bodies in do not keep a valid
review waiting in the listen backlog until their deadline.

Pure but for `read`'s clock (given)."""

from __future__ import annotations

import time
from collections.abc import Callable

MiB = 1 << 20
#: What a body is given beyond its length at MIN_BODY_RATE: the time to
#: cross a loaded network, as the headers are given connection.HEADERS_S.
BODY_S = 3.0
#: The least pace a body is given (bytes a second): a 4 MiB review is due
#: within 7 s of its headers, a 16 MiB conversion within 19 s.
MIN_BODY_RATE = MiB
#: How far behind the least pace a body may fall before its connection
#: may be closed for a new one: a body in flight after its headers, not
#: yet read, or held up by a lost packet's retransmission (Linux waits at
#: least 200 ms), is not behind. Shorter lets a valid client queued behind
#: trickling ones in the listen backlog in sooner: they are let in about
#: as fast as bodies fall behind (docs/security.md, measured). The risk
#: this leaves: a thread held up longer than this (the interpreter lock
#: held by a large conversion's parse or encoding, 0.64 s for 15.6 MiB)
#: falls behind unread, and may be closed if every slot is taken then.
BEHIND_S = 0.5
#: A body whose deadline passed before its thread could read (held up as
#: above) still has the bytes already in read: past its deadline, reads
#: that do not wait, for up to this long.
LAST_LOOK_S = 0.1
#: How long such a read waits: none, but a socket's timeout of 0 would make
#: it non-blocking, which TLS reads answer with an error, not a timeout.
NO_WAIT_S = 0.001


class Late(TimeoutError):
    """The body was not all in by its deadline; `received` bytes were."""

    def __init__(self, received: int) -> None:
        super().__init__(f"{received} bytes by the deadline")
        self.received = received


def due(headers_at: float, length: int, review_due: float) -> tuple[float, bool]:
    """When a body of `length` bytes, its headers in at `headers_at`, is
    due, and whether that is the review's own deadline (`review_due`,
    sooner than its length's)."""
    paced = headers_at + BODY_S + length / MIN_BODY_RATE
    return (review_due, True) if review_due <= paced else (paced, False)


def behind_at(began: float, received: int) -> float:
    """When a body whose reading began at `began`, `received` of its bytes
    in, falls behind the least pace."""
    return began + BEHIND_S + received / MIN_BODY_RATE


def late(length: int, received: int, within_s: float, by_review: bool,
         waited: bool = False) -> str:
    """What a 408 for a late body says: what was due, by when (from its
    headers, or its taking the slot it `waited` for), and why then."""
    why = "the review's deadline" if by_review else (
        f"its deadline: {BODY_S:g} s, and {MiB / MIN_BODY_RATE:g} s a MiB")
    since = "its taking a body's slot" if waited else "its headers"
    return (f"body: expected its {length} bytes within {within_s:.3g} s of {since} "
            f"({why}), got {received}")


def read(receive: Callable[[int, float], bytes], length: int, due_at: float,
         came: Callable[[int], None], clock: Callable[[], float] = time.monotonic) -> bytes:
    """`length` bytes from `receive(at_most, timeout_s)`, all before `due_at`
    (a timeout per read would let a byte at a time go on for ever);
    `came(received)` after each piece. Raises Late past `due_at` (bytes
    already in read first, for up to LAST_LOOK_S), ValueError if the
    stream ends before `length`."""
    chunks, received = [], 0
    while received < length:
        remaining = due_at - clock()
        if remaining <= -LAST_LOOK_S:
            raise Late(received)
        try:
            chunk = receive(min(length - received, 1 << 16), max(remaining, NO_WAIT_S))
        except TimeoutError:
            raise Late(received) from None
        if not chunk:
            raise ValueError(f"the body ended {length - received} bytes before its "
                             "Content-Length")
        chunks.append(chunk)
        received += len(chunk)
        came(received)
    return b"".join(chunks)
