"""An admission connection before and between its requests (the server's
Handler, admission/server.py, answers them): its TLS handshake, request
line and headers all within HEADERS_S of its taking a connection slot, and
while it awaits them, its slot given up to a new connection when all are
taken (admission/connection_slots.py); then its body, read by its deadline
and, while it falls behind its pace, its slot likewise given up
(admission/body.py).

The deadline is one for the whole, not a socket timeout per read: each
read is given what is left of it (`HeadersDue`; CPython bounds a TLS
handshake as a whole by the socket's timeout), so a byte at a time does not
keep the headers coming. Past it the connection is closed, after its
handshake with a 408. A kept-alive connection's next request line and
headers are due within IDLE_S of its last answer, and it is closed without
one (as any server closes an idle connection); it gives its slot up to a
new connection only once idle KEPT_ALIVE_GRACE_S. A request whose headers
came in as its connection was closed for another is not answered."""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from ckptdrain.operator.admission import body

log = logging.getLogger("ckptdrain.admission")

#: A connection's TLS handshake, request line and headers must all be in
#: within this of its taking a slot: the apiserver sends them at once, and
#: a slot held longer (a bare TCP connect, headers sent a byte at a time)
#: would outlast the chart's webhook timeoutSeconds (5 s).
HEADERS_S = 3.0
#: A kept-alive connection's next request line and headers must be in
#: within this of its last answer, else it is closed (the apiserver opens
#: another); longer than the apiserver's own idle timeout (90 s).
IDLE_S = 120.0
#: A kept-alive connection is not closed for a new connection within this
#: of its last answer: its client may be sending its next request (Go's
#: transport reuses a connection at once for a queued one, and does not
#: send a POST again once written); the apiserver sends one's line and
#: headers at once, well within it.
KEPT_ALIVE_GRACE_S = 1.0
#: A new connection is not closed for another within this of its taking a
#: slot (connection_slots.py's `settle`): time enough for the apiserver's
#: TLS handshake, request line and headers, on a network's round trips.
#: Under a flood, new connections wait for one older; so at most
#: MAX_CONNECTIONS of them are let in per this many seconds.
SETTLE_S = 0.1


def unblock(sock: socket.socket) -> None:
    """Ends the read or TLS handshake `sock`'s own thread is blocked in,
    from another thread: a shutdown (that thread sees the end of the
    stream), not a close, which stays that thread's. The plain socket's
    shutdown: an SSLSocket's own also drops its TLS state under that thread."""
    with contextlib.suppress(OSError):  # the peer may have gone already
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class HeadersDue(io.RawIOBase):
    """`sock`'s reads, each given `timeout()` seconds: what is left of the
    request line and headers' deadline while they are due (it raises
    TimeoutError once that is past), None once they are in (the socket's
    timeout, set by the body's reader, stands)."""

    def __init__(self, sock: socket.socket, timeout: Callable[[], float | None]) -> None:
        self.sock, self.timeout = sock, timeout

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.timeout()
        if left is not None:
            self.sock.settimeout(left)
        return self.sock.recv_into(buffer)


class Connection(BaseHTTPRequestHandler):
    """The request's handler's connection part; `server.connection_slots`
    holds its slot (taken and released by the server)."""

    server: Any

    def setup(self) -> None:
        #: When the request line and headers are due; None: they are in.
        self.headers_due: float | None = time.monotonic() + HEADERS_S
        # What an answer before a request line is parsed (the 408) reads.
        self.command, self.requestline, self.request_version = "", "", "HTTP/1.1"
        super().setup()
        self.rfile.close()  # replaced: each read is given what is left of headers_due
        self.rfile = io.BufferedReader(HeadersDue(self.request, self._headers_timeout))

    def handle(self) -> None:
        try:
            self.request.settimeout(self._headers_timeout())
            self.request.do_handshake()
        except TimeoutError:  # nothing can be answered without TLS
            log.debug("admission: a connection's TLS handshake was not done within "
                      "%g s; closed", HEADERS_S)
            return
        super().handle()

    def _headers_timeout(self) -> float | None:
        if self.headers_due is None:
            return None
        left = self.headers_due - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request line and headers were due")
        return left

    def handle_one_request(self) -> None:
        first = self.headers_due is not None
        if not first:  # kept alive: the next request's line and headers are due
            self.headers_due = time.monotonic() + IDLE_S
            self.server.connection_slots.awaiting_next(self.request, KEPT_ALIVE_GRACE_S)
        super().handle_one_request()  # a read past headers_due ends the connection
        if first and self.headers_due is not None and time.monotonic() >= self.headers_due:
            log.debug("admission: a connection's request line and headers were not in "
                      "within %g s; answered 408 and closed", HEADERS_S)
            self.close_connection = True
            self.request.settimeout(HEADERS_S)  # a few hundred bytes, to a client that may not read
            with contextlib.suppress(OSError):
                self.send_error(408, f"request line and headers: expected within "
                                     f"{HEADERS_S:g} s of the connection's taking a server slot")
                self.wfile.flush()

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # reads the headers
        self.headers_due = None
        self.request.settimeout(IDLE_S)
        if not self.server.connection_slots.headers_in(self.request):  # no longer gives way
            # Closed for a new connection as its headers came in: its socket
            # is shut, so no answer would reach the client, which sees its
            # connection closed (the window connection_slots.py states).
            log.debug("admission: a connection's headers came in as it was closed for "
                      "a new connection; not answered")
            self.close_connection = True
            return False
        return parsed

    def _read_body(self, length: int, began: float, due: float) -> bytes:
        """`length` bytes of body, its reading begun at `began`, all before
        `due` (body.read), its connection closable for a new one while
        behind its pace."""
        connections = self.server.connection_slots

        def receive(at_most: int, timeout: float) -> bytes:
            self.request.settimeout(timeout)
            return self.rfile.read1(at_most)

        connections.reading_body(self.request, body.behind_at(began, 0))
        return body.read(receive, length, due, lambda received: connections.reading_body(
            self.request, body.behind_at(began, received)))
