"""The admission process's HTTPS server (admission/process.py): the
standard library's, one thread per connection, bounded, with the TLS
context made again when the certificate files change. Each review (an
AdmissionReview, or a ConversionReview at the CRD's conversion path) is
answered by the reviewer on one event loop (a ConversionReview by the
converter, in the connection's thread); this module knows only HTTP, TLS
and the bounds.

Bounded: at most MAX_CONNECTIONS at once, each one's TLS handshake,
request line and headers within HEADERS_S of its taking a slot (else
closed, after the handshake with a 408: admission/connection.py); when all
are taken, the connection longest awaiting its first request's headers, a
kept-alive one idle past its grace, or one whose body is behind its pace
is closed for the next, and answers say `Connection: close` while it waits
(admission/connection_slots.py; with none to close, the next waits in the
listen backlog). At most MAX_IN_FLIGHT reviews answered at once and as
many large bodies read (SMALL_BODY_BYTES), each slot awaited as long as
the apiserver waits (its `?timeout=`; a conversion, sent none,
CONVERSION_TIMEOUT_S), a body due sooner by its length from its reading's
start (admission/body.py); a kept-alive connection's next request line
and headers within IDLE_S. Every answer is JSON, an error's too.

Client certificates (opt-in, CKPTDRAIN_WEBHOOK_CLIENT_CA): any pod that
reaches the Service could otherwise post a forged AdmissionReview and read
back another tenant's injection patch. With a client CA, a certificate a
client presents must be signed by it (else the handshake fails), and an
AdmissionReview is answered only on a connection that presented one. The
conversion path stays open without one: the apiserver never presents a
client certificate to a CRD conversion webhook (only admission webhooks
have a kubeConfigFile), and a conversion is pure, reading nothing but the
objects it was sent. The TLS context, renewed: admission/certificates.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
import sys
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import ThreadingHTTPServer
from typing import Any

from ckptdrain.operator.admission import body
from ckptdrain.operator.admission.certificates import Certificates
from ckptdrain.operator.admission.connection import IDLE_S, SETTLE_S, Connection, unblock
from ckptdrain.operator.admission.connection_slots import ConnectionSlots, Slots
from ckptdrain.operator.admission.refusal_log import RefusalLog

log = logging.getLogger("ckptdrain.admission")

#: The largest review we read: a pod near etcd's object size limit, encoded.
MAX_REVIEW_BYTES = 4 << 20
#: Connections open at once, and reviews answered at once.
MAX_CONNECTIONS = 128
MAX_IN_FLIGHT = 8
#: A review's body of up to this many bytes (a pod's review is a few KiB to
#: tens of KiB) is read holding no answer slot, and takes one once it has
#: arrived; a larger body holds one of MAX_IN_FLIGHT body slots while it
#: arrives. A conversion's small body, likewise, is read holding no conversion
#: slot. So slow bodies hold no slot a review that has arrived needs, and slow
#: headers and bodies make way for a new connection (connection.py, body.py).
#: Bodies arriving or waiting for an answer slot are at most MAX_CONNECTIONS ×
#: SMALL_BODY_BYTES (32 MiB) plus MAX_IN_FLIGHT × MAX_REVIEW_BYTES (32 MiB) of
#: raw bytes, each briefly held twice while its chunks are joined; parsing
#: one costs several times its size (below): raw bytes are not the bound.
SMALL_BODY_BYTES = 256 << 10
#: A ConversionReview carries a whole list (`kubectl get ckpol -A`: every
#: policy of the cluster in one review, a few KB each with its status), so
#: conversions get a larger cap and a slot of their own, and are answered in
#: the connection's thread (pure, no API call), never waiting for admission
#: slots. Parsing and encoding a large list holds the interpreter lock, so
#: admissions answered meanwhile wait for it.
#:
#: Sized by memory. The operator container (values.yaml
#: operator.resources.limits.memory: 512 MiB) holds the operator's process
#: and this one. Measured: json.loads of a 63 MiB review took this process's
#: RSS from 151 to 484 MiB, about 5.3× the body; a 32 MiB review of 8,087
#: policies cost +114 MiB parsed, +157 MiB converted (copies) and +51 MiB
#: encoded, about 400 MiB at its peak, and the operator's own process
#: needs 200-250 MiB at scale (docs/scale.md): past the limit. The
#: converter drops each original once its copy is made (conversion.py),
#: so the parsed and converted lists are not held whole at once, and the
#: cap is 16 MiB: about 16 + 57 parsed-or-converted + 26 encoded ≈ 100 MiB
#: above the process's baseline, with one slot. A list beyond 16 MiB (about
#: 4,000 policies at 4 KB each) is refused (413); a second conversion
#: waits for the slot until the apiserver's deadline (CONVERSION_TIMEOUT_S),
#: then its body is due by its length (body.py), from when it has the slot.
MAX_CONVERSION_BYTES = 16 << 20
CONVERSIONS_IN_FLIGHT = 1
#: How long a review may take when the apiserver does not say (its
#: `?timeout=`, the webhook's timeoutSeconds: at most 30 s). Later than that
#: the apiserver has given up, and nothing is gained by answering.
ANSWER_TIMEOUT_S = 10.0
#: How long a conversion may take, its body's arrival included. The
#: apiserver sends no `?timeout=` to a CRD's conversion webhook (it posts
#: without one, and waits at least 30 s), so a large list sent slowly is
#: still read whole within that wait, however long an admission may take.
CONVERSION_TIMEOUT_S = 30.0


class UnknownWebhook(Exception):
    """A path we do not serve."""


class BadReview(Exception):
    """A review not answered: HTTP 400, a Status saying why. To the apiserver
    a webhook failure, which the webhook's failurePolicy decides."""


class Server(ThreadingHTTPServer):
    """HTTPS, one thread per connection; each review is answered by
    `reviewer` (process.Reviewer: `await reviewer(request, path,
    received)`) on one event loop (`loop`), where the rules run and hand
    their API reads to threads.

    Bounded as the module says: connection slots (connection_slots.py),
    review, body and conversion slots (the others wait, each until its
    deadline), connection.HEADERS_S and IDLE_S."""

    daemon_threads = True
    allow_reuse_address = True
    #: Kopf's server (aiohttp) listened with a backlog of 128; a job's burst of
    #: pod creations opens many connections at once.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], certificates: Certificates,
                 reviewer: Any, loop: asyncio.AbstractEventLoop,
                 converter: Callable[[dict[str, Any], float], dict[str, Any]] | None = None,
                 conversion_path: str = "convert") -> None:
        self.certificates, self.reviewer, self.loop = certificates, reviewer, loop
        #: Answers ConversionReviews at /`conversion_path` in the connection's
        #: thread (None: that path is the reviewer's like any other).
        self.converter, self.conversion_path = converter, conversion_path
        self.connection_slots = ConnectionSlots(MAX_CONNECTIONS, settle=SETTLE_S)
        self.in_flight = Slots(self.connection_slots, MAX_IN_FLIGHT)
        self.large_bodies = Slots(self.connection_slots, MAX_IN_FLIGHT)
        self.conversions = Slots(self.connection_slots, CONVERSIONS_IN_FLIGHT)
        self.refusals = RefusalLog()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = self.socket.accept()
        # Answers are small and must not wait for the peer's delayed ACK.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The handshake happens in the connection's own thread (Handler.setup),
        # so a slow or silent client never holds up the next accept.
        return (self.certificates.context().wrap_socket(
            sock, server_side=True, do_handshake_on_connect=False), address)

    def process_request(self, request: Any, client_address: Any) -> None:
        # At the cap, a connection awaiting its headers makes way; with none,
        # this one waits here (and those after it in the listen backlog).
        self.connection_slots.take(request, lambda: self._make_way(request))
        super().process_request(request, client_address)

    def _make_way(self, request: Any) -> None:
        log.debug("admission: all %d connection slots taken; closed the connection "
                  "longest awaiting its headers", self.connection_slots.capacity)
        unblock(request)  # its thread ends, and releases the slot

    def shutdown_request(self, request: Any) -> None:
        # Every connection ends here, thread or none (socketserver).
        self.connection_slots.release(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, ssl.SSLCertVerificationError):
            # A certificate the client CA did not sign: someone tried. Said
            # at most once a minute, however often they retry.
            refusals = self.refusals.note()
            if refusals == 1:
                log.warning("admission: refused a client certificate from %s: %s",
                            client_address, error.verify_message)
            elif refusals:
                log.warning("admission: refused %d client certificates since the last "
                            "such line, the latest from %s: %s", refusals, client_address,
                            error.verify_message)
            return
        # Probes that connect and leave (a kubelet's tcpSocket readiness
        # check), clients that give up: not worth a traceback.
        log.debug("admission: connection from %s ended: %s", client_address, sys.exc_info()[1])

    def slots(self, converting: bool, length: int) -> tuple[Slots | None, Slots | None]:
        """(the slot held while a body of `length` bytes arrives, the one taken
        once it has): see SMALL_BODY_BYTES. None: no slot."""
        if converting:  # one at a time answered, and a large one read
            return ((self.conversions, None) if length > SMALL_BODY_BYTES
                    else (None, self.conversions))
        return (self.large_bodies if length > SMALL_BODY_BYTES else None), self.in_flight

    def answer(self, request: dict[str, Any], path: str, received: float,
               deadline: float) -> dict[str, Any]:
        future = asyncio.run_coroutine_threadsafe(
            self.reviewer(request, path, received), self.loop)
        try:
            return future.result(max(0.0, deadline - time.monotonic()))
        finally:
            future.cancel()  # no-op once done; a late one must not run on


def request_timeout(query: str, default: float = ANSWER_TIMEOUT_S) -> float:
    """The seconds the apiserver waits for this review (its `?timeout=5s`),
    else `default`; at most 30 s."""
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name == "timeout" and value.endswith("s"):
            try:
                return min(30.0, max(0.5, float(value[:-1])))
            except ValueError:
                break
    return default


class Handler(Connection):
    protocol_version = "HTTP/1.1"  # keep-alive: the apiserver reuses connections
    #: Buffered: the status line, headers and body leave in one write.
    wbufsize = 1 << 16
    server: Server

    def handle_expect_100(self) -> bool:
        answered = super().handle_expect_100()
        self.wfile.flush()  # buffered: the client waits for it before the body
        return answered

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or "")
        except ValueError:
            self._fail(411, "Content-Length: expected a number of bytes")
            return
        path, _, query = self.path.partition("?")
        path = path.strip("/")
        converter = self.server.converter if path == self.server.conversion_path else None
        converting = converter is not None
        if not converting and not self._client_trusted():
            # A Status, which the apiserver quotes in its refusal: whoever set
            # up its kubeConfigFile sees what is missing.
            self.close_connection = True
            self._send(403, {"apiVersion": "v1", "kind": "Status", "status": "Failure",
                             "code": 403, "reason": "Forbidden",
                             "message": "ckptdrain admission: a client certificate signed by "
                                        "CKPTDRAIN_WEBHOOK_CLIENT_CA is required for "
                                        "admission reviews; none was presented"})
            return
        limit = MAX_CONVERSION_BYTES if converting else MAX_REVIEW_BYTES
        if not 0 < length <= limit:
            self._fail(413, f"Content-Length: expected 1 to {limit} bytes, got {length}")
            return
        received, headers_at = time.perf_counter(), time.monotonic()
        told_s = request_timeout(query, 0.0)  # 0: none told (a conversion's: none)
        wait_s = told_s or (CONVERSION_TIMEOUT_S if converting else ANSWER_TIMEOUT_S)
        deadline = headers_at + wait_s
        why = f"{wait_s:g} s: " + ("its ?timeout=" if told_s else "sent no ?timeout=")
        # A slow body holds no slot a review that has arrived needs (SMALL_BODY_BYTES).
        reading, answering = self.server.slots(converting, length)
        with contextlib.ExitStack() as held:
            # Awaited as long as the apiserver waits, closable for a new connection.
            if reading is not None and not self._take(reading, deadline, held, why, headers_at):
                return
            # Its own deadline by its length from now (body.py): a slot's wait is not its.
            began = time.monotonic()
            body_due, by_review = body.due(began, length, deadline)
            data: bytes | Exception
            try:
                data = self._read_body(length, began, body_due)
            except (ValueError, TimeoutError) as error:
                data = error
            self.request.settimeout(IDLE_S)
            if not self.server.connection_slots.body_in(self.request):
                # Closed for a new connection, behind its pace: its socket is shut.
                self.close_connection = True
                return
            if isinstance(data, body.Late):
                self._fail(408, body.late(length, data.received, body_due - began, by_review,
                                          waited=reading is not None))
                return
            if isinstance(data, Exception):
                self._fail(400, f"body: expected an AdmissionReview or ConversionReview "
                                f"({data})")
                return
            if answering is not None and not self._take(answering, deadline, held, why):
                return
            request = self._parsed(data)
            del data  # parsed: the bytes are not held while it is answered
            if request is not None:
                self._answer(request, converter, path, received, deadline)

    def _take(self, slots: Slots, deadline: float, held: contextlib.ExitStack, why: str,
              body_from: float | None = None) -> bool:
        """One of `slots`, held until `held` closes; else False, answered 503
        naming the review's deadline (`why`) that ran out, or not at all: a
        body's (`body_from` its headers' time), none of it read as it waits,
        so behind its pace from then, whose connection was closed for another."""
        if body_from is not None:
            self.server.connection_slots.reading_body(self.request, body.behind_at(body_from, 0))
        taken = slots.acquire(timeout=max(0.0, deadline - time.monotonic()),
                              connection=self.request,
                              behind_after=None if body_from is None else body.BEHIND_S)
        if not taken:
            if taken is None:
                self.close_connection = True  # its socket is shut
            else:
                self._fail(503, f"too many reviews at once; no slot came free by the "
                                f"review's deadline ({why})")
            return False
        held.callback(slots.release)
        return True

    def _parsed(self, body: bytes) -> dict[str, Any] | None:
        """`body` as a JSON object; else None, answered 400."""
        try:
            request = json.loads(body)
            if not isinstance(request, dict):
                raise ValueError("not a JSON object")
            return request
        except ValueError as error:
            self._fail(400, f"body: expected an AdmissionReview or ConversionReview ({error})")
        except RecursionError:  # the parser's own bound on nesting
            self._fail(400, "body: expected an AdmissionReview or ConversionReview "
                            "(JSON nested too deeply)")
        return None

    def _answer(self, request: dict[str, Any],
                converter: Callable[[dict[str, Any], float], dict[str, Any]] | None,
                path: str, received: float, deadline: float) -> None:
        try:
            if converter is not None:
                self._send(200, converter(request, received))
            else:
                self._send(200, self.server.answer(request, path, received, deadline))
        except UnknownWebhook as error:
            self._fail(404, str(error))
        except BadReview as error:  # a Status: the apiserver quotes its message
            self.close_connection = True
            self._send(400, {"apiVersion": "v1", "kind": "Status", "status": "Failure",
                             "code": 400, "reason": "BadRequest", "message": str(error)})
        except Exception as error:  # a timeout, a bug: answered, never dropped
            log.warning("admission: no answer to a review at /%s: %r", path, error)
            self._fail(500, f"no answer: {error!r}")

    def _not_posted(self) -> None:
        """Every webhook is a POST; anything else is answered, as JSON, so."""
        self._fail(405, f"method {str(self.command)[:32]}: expected POST")

    do_GET = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = _not_posted

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """The standard library's errors (a method with no do_*: 501; a bad
        request line; headers too long), answered in JSON like ours rather
        than its HTML page."""
        if code == HTTPStatus.NOT_IMPLEMENTED:  # a method we have no do_* for
            self._not_posted()
            return
        self._fail(code, message or HTTPStatus(code).phrase)

    def _client_trusted(self) -> bool:
        """True without a client CA; with one, True only if this connection
        presented a certificate (the handshake verified it against the CA)."""
        if not self.server.certificates.client_ca:
            return True
        return bool(self.request.getpeercert())

    def _fail(self, code: int, message: str) -> None:
        # What is left of the request is not read: this connection ends here.
        self.close_connection = True
        self._send(code, {"error": message}, allow="POST" if code == 405 else None)

    def _send(self, code: int, body: dict[str, Any], allow: str | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        if allow:
            self.send_header("Allow", allow)
        self.send_header("Content-Length", str(len(data)))
        if self.server.connection_slots.waiting:
            # A new connection waits for this one's slot: the client opens a
            # new connection for its next request rather than reuse one that
            # may be closed under it (connection_slots.py).
            self.close_connection = True
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":  # an answer to HEAD has no body
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return  # every review is counted in the operator's metrics instead
