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
import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.support.admission_tls import Readers, allowed, serving, valid_review

from ckptdrain.operator import config
from ckptdrain.operator.admission import connection
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission import server as admission_server
from ckptdrain.operator.admission.policy_mirror import PolicyMirror

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
SLOTS = 8
#: The chart's webhook timeoutSeconds: how long the apiserver waits.
APISERVER_WAIT_S = 5.0


@dataclass
class Served:
    port: int
    context: ssl.SSLContext

    def bare(self) -> socket.socket:
        """A TCP connection that never speaks TLS."""
        return socket.create_connection(("127.0.0.1", self.port))

    def tls(self) -> ssl.SSLSocket:
        """A connection whose TLS handshake is done, and nothing sent."""
        return self.context.wrap_socket(self.bare(), server_hostname="127.0.0.1")

    def https(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context,
                                           timeout=APISERVER_WAIT_S)


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    monkeypatch.setattr(admission_server, "MAX_CONNECTIONS", SLOTS)
    with serving(tmp_path, CFG, admission_process.Reviewer(CFG, PolicyMirror())) as (
            server, cert):
        yield Served(server.server_address[1], ssl.create_default_context(cafile=str(cert)))


@contextmanager
def trickling_headers(socks: list[ssl.SSLSocket]) -> Iterator[None]:
    """`socks` each sending a request line a byte every 0.2 s until exit
    (each byte well within a read's own timeout)."""
    line = f"POST /{admission.MUTATE_ID}?timeout=5s HTTP/1.1\r\n".encode()
    stop = threading.Event()

    def trickle() -> None:
        for at in range(len(line)):
            if stop.wait(0.2):
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
            began = time.monotonic()
            answer = valid_review(served.https(), "u-1", "?timeout=5s")
            took = time.monotonic() - began
            assert answer == allowed("u-1")
            assert took < APISERVER_WAIT_S, f"answered after {took:.1f} s"
            assert closed_by_server(bare[0])  # the first to take a slot
    finally:
        for sock in bare + slow:
            sock.close()


def test_a_connection_sending_nothing_or_a_byte_at_a_time_is_closed_at_its_deadline(
        served: Served) -> None:
    """A bare TCP connect is closed within the apiserver's wait; a request
    line trickled in is answered 408, though each byte came well within a
    read's timeout (not kept alive by them)."""
    bare, slow = served.bare(), served.tls()
    try:
        assert closed_by_server(bare)
        line = f"POST /{admission.MUTATE_ID}?timeout=5s HTTP/1.1\r\n".encode()
        slow.settimeout(0.2)
        answered = b""
        for at in range(len(line)):  # about 12 s of trickle
            try:
                answered = slow.recv(4096)
            except TimeoutError:
                slow.sendall(line[at:at + 1])
                continue
            break
        assert answered.startswith(b"HTTP/1.1 408"), answered
        assert b"request line and headers: expected within" in answered
    finally:
        bare.close()
        slow.close()


def test_a_connection_whose_headers_are_in_never_makes_way(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection that has held its slot longest is reading its body
    (headers in, within the review's bounds); every other slot is held by a
    bare TCP connect. Valid reviews sent meanwhile are answered, bare
    connects making way for them, and the body's review is answered once
    it has arrived."""
    monkeypatch.setattr(connection, "HEADERS_S", 60.0)
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
