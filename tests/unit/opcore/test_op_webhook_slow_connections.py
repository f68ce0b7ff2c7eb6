"""The admission server's connections (admission/connection.py,
connection_slots.py) against clients that hold them without sending a
request: bare TCP connects and request lines and headers sent a byte at a
time give up their slots within the apiserver's wait (the chart's webhook
timeoutSeconds, 5 s), and make way for a valid review when every slot is
taken; a connection whose headers are in never does. And a conversion's
small body trickled in holds no other conversion up. The real server, over
real TLS, with its connection slots cut to 8."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from tests.support.admission_tls import (
    APISERVER_WAIT_S,
    Readers,
    Served,
    allowed,
    served_with_slots,
    valid_review,
)

from ckptdrain.operator import config
from ckptdrain.operator.admission import body as admission_body
from ckptdrain.operator.admission import connection
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission import server as admission_server
from ckptdrain.operator.admission.connection_slots import ConnectionSlots

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
SLOTS = 8
#: A trickled request line: a byte every TRICKLE_S, well within a read's own timeout.
TRICKLE_S = 0.2


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    with served_with_slots(tmp_path, CFG, SLOTS, monkeypatch) as served:
        yield served


@contextmanager
def trickling_headers(socks: list[ssl.SSLSocket]) -> Iterator[None]:
    """`socks` each sending a request line a byte every TRICKLE_S until exit."""
    line = f"POST /{admission.MUTATE_ID}?timeout=5s HTTP/1.1\r\n".encode()
    stop = threading.Event()

    def trickle() -> None:
        for at in range(len(line)):
            if stop.wait(TRICKLE_S):
                return
            for sock in socks:
                with contextlib.suppress(OSError):  # closed by the server: made way
                    sock.sendall(line[at:at + 1])

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def closed_by_server(sock: socket.socket) -> bool:
    """True if the server closes `sock` within the apiserver's wait."""
    sock.settimeout(APISERVER_WAIT_S)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:  # reset: closed too
        return True


def test_slow_connections_in_every_slot_make_way_for_a_valid_review(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every slot held by a bare TCP connect or a request line trickled in:
    a valid review is still answered within the apiserver's wait, the
    connection longest awaiting its headers closed for it. Their own
    deadline set far off, so that only making way can let it in."""
    monkeypatch.setattr(connection, "HEADERS_S", 60.0)
    bare = [served.bare() for _ in range(SLOTS // 2)]
    # Each TLS handshake done: the server has taken every bare one before.
    slow = [served.tls() for _ in range(SLOTS - len(bare))]
    try:
        with trickling_headers(slow):
            # Within the apiserver's wait: the client's own timeout.
            assert valid_review(served.https(), "u-1", "?timeout=5s") == allowed("u-1")
            assert closed_by_server(bare[0])  # the first to take a slot
    finally:
        for sock in bare + slow:
            sock.close()


def answered_408(answer: bytes) -> None:
    """`answer` is the server's JSON 408, and it closes the connection."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = {name.lower(): value for name, _, value in
               (line.partition(": ") for line in lines)}
    assert status.startswith("HTTP/1.1 408 "), answer
    assert headers.get("content-type") == "application/json", answer
    assert headers.get("connection") == "close", answer
    assert json.loads(body) == {"error": "request line and headers: expected within "
                                         f"{connection.HEADERS_S:g} s of the connection's "
                                         "taking a server slot"}


def read_to_end(sock: socket.socket) -> bytes:
    """All `sock` receives until the server closes it."""
    sock.settimeout(APISERVER_WAIT_S)
    answer = b""
    while chunk := sock.recv(4096):
        answer += chunk
    return answer


def test_a_connection_sending_nothing_or_a_byte_at_a_time_is_closed_at_its_deadline(
        served: Served) -> None:
    """A bare TCP connect is closed within the apiserver's wait; a request
    line trickled in, each byte well within a read's timeout, is answered
    408 while its bytes still come: the deadline is one for the whole."""
    bare = served.bare()
    try:
        assert closed_by_server(bare)
    finally:
        bare.close()
    line = f"POST /{admission.MUTATE_ID}?timeout=5s HTTP/1.1\r\n".encode()
    # Longer than the deadline: a trickle the whole way would outlast it.
    assert len(line) * TRICKLE_S > 2 * connection.HEADERS_S
    began = time.monotonic()
    slow = served.tls()
    try:
        slow.settimeout(TRICKLE_S)
        sent, answered = 0, b""
        while sent < len(line):
            try:
                answered = slow.recv(4096)
                break
            except TimeoutError:
                slow.sendall(line[sent:sent + 1])
                sent += 1
        else:
            pytest.fail(f"not answered while the request line came, {sent} bytes over "
                        f"{time.monotonic() - began:.1f} s")
        took = time.monotonic() - began
        answered_408(answered + read_to_end(slow))
        # Bytes kept coming until the deadline, which is what ended it.
        assert sent >= connection.HEADERS_S / TRICKLE_S / 2, sent
        assert took >= connection.HEADERS_S, f"{sent} bytes, answered after {took:.1f} s"
    finally:
        slow.close()


def test_headers_in_as_the_connection_is_closed_for_another_are_not_answered(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """A review whose headers are read in the moment a new connection
    closes its connection (held there until it has) is not answered: its
    socket is shut, and its thread ends, releasing the slot. (No settling
    time for a new connection: the newcomer may come within it.)"""
    monkeypatch.setattr(connection, "HEADERS_S", 60.0)
    monkeypatch.setattr(served.server.connection_slots, "settle", 0.0)
    headers_in, posted = ConnectionSlots.headers_in, []
    reading = threading.Event()

    def closed_first(slots: ConnectionSlots, sock: object) -> bool:
        reading.set()
        served.until_a_connection_waits()  # the newcomer has closed this one
        return headers_in(slots, sock)

    monkeypatch.setattr(ConnectionSlots, "headers_in", closed_first)
    post = admission_server.Handler.do_POST
    monkeypatch.setattr(admission_server.Handler, "do_POST",
                        lambda handler: posted.append(handler) or post(handler))
    ended, shutdown_request = threading.Event(), admission_server.Server.shutdown_request
    monkeypatch.setattr(admission_server.Server, "shutdown_request",  # the first to end
                        lambda server, sock: ended.set() or shutdown_request(server, sock))
    review = served.https()
    review.connect()  # the first to take a slot: the longest awaiting its headers
    others = [served.bare() for _ in range(SLOTS - 1)]
    try:
        review.request("POST", f"/{admission.MUTATE_ID}?timeout=5s", body=b"{}",
                       headers={"Content-Type": "application/json"})
        assert reading.wait(20)
        newcomer = served.bare()
        assert review.sock is not None
        assert closed_by_server(review.sock)
        assert ended.wait(20)  # its thread is done with it
        assert posted == []
        newcomer.close()
    finally:
        review.close()
        for sock in others:
            sock.close()


def test_a_connection_whose_body_keeps_its_pace_never_makes_way(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection that has held its slot longest is reading its body
    (headers in, its body within its deadline and not behind its pace: both
    set far off here; a body behind it makes way,
    test_op_webhook_slow_bodies.py); every other slot is held by a bare TCP
    connect. Valid reviews sent meanwhile are answered, bare connects
    making way for them, and the body's review is answered once it has
    arrived."""
    monkeypatch.setattr(connection, "HEADERS_S", 60.0)
    monkeypatch.setattr(admission_body, "BODY_S", 60.0)
    monkeypatch.setattr(admission_body, "BEHIND_S", 60.0)
    readers = Readers(monkeypatch)
    body = json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-body", "operation": "CREATE", "namespace": "ml",
                    "object": {"metadata": {"name": "p"}, "spec": {"containers": [
                        {"name": "c", "image": "i"}]}}}}).encode()
    reading = served.https()
    reading.putrequest("POST", f"/{admission.MUTATE_ID}?timeout=30s")
    reading.putheader("Content-Type", "application/json")
    reading.putheader("Content-Length", str(len(body)))
    reading.endheaders(body[:1])
    readers.wait_for(1)
    bare = [served.bare() for _ in range(SLOTS - 1)]
    try:
        for uid in range(3):
            assert valid_review(served.https(), f"u-{uid}", "?timeout=5s") == allowed(f"u-{uid}")
        assert reading.sock is not None
        reading.sock.sendall(body[1:])
        response = reading.getresponse()
        assert (response.status, json.loads(response.read())) == allowed("u-body")
    finally:
        reading.close()
        for sock in bare:
            sock.close()


def conversion(uid: str) -> bytes:
    return json.dumps({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "request": {"uid": uid, "desiredAPIVersion": "ckptdrain.io/v1beta1", "objects": [
            {"apiVersion": "ckptdrain.io/v1alpha1", "kind": "CheckpointPolicy",
             "metadata": {"name": "p", "namespace": "ns"}, "spec": {"interval": "1d"}}]}}).encode()


def test_a_small_conversion_trickled_in_holds_no_other_conversion_up(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """Conversions are answered one at a time; one whose small body is
    still arriving does not keep the next, which has arrived, waiting."""
    readers = Readers(monkeypatch)
    slow_body = conversion("slow")
    slow = served.https()
    slow.putrequest("POST", "/convert")
    slow.putheader("Content-Type", "application/json")
    slow.putheader("Content-Length", str(len(slow_body)))
    slow.endheaders(slow_body[:1])
    readers.wait_for(1)
    try:
        fast = served.https()
        fast.request("POST", "/convert", body=conversion("fast"),
                     headers={"Content-Type": "application/json"})
        response = fast.getresponse()
        answer = json.loads(response.read())
        assert response.status == 200 and answer["response"]["uid"] == "fast"
        assert readers.count >= 1  # the slow body was still arriving: not waited for
        assert slow.sock is not None
        slow.sock.sendall(slow_body[1:])
        response = slow.getresponse()
        assert response.status == 200 and json.loads(response.read())["response"]["uid"] == "slow"
    finally:
        slow.close()
