"""The admission server's kept-alive connections (admission/connection.py,
connection_slots.py): a client reusing its connection while a new one
waits for a slot is told to open a new connection (`Connection: close`)
rather than closed under its next request, and is answered on it; a
kept-alive connection's next request line and headers are due within
IDLE_S of its last answer. The real server, over real TLS."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.admission_tls import Readers, Served, allowed, served_with_slots, valid_review

from ckptdrain.operator import config
from ckptdrain.operator.admission import connection
from ckptdrain.operator.admission import rules as admission

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
REVIEW = json.dumps({
    "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
    "request": {"uid": "u-1", "operation": "CREATE", "namespace": "ml",
                "object": {"metadata": {"name": "p"}, "spec": {"containers": [
                    {"name": "c", "image": "i"}]}}}}).encode()


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """One connection slot: a second connection waits for it."""
    with served_with_slots(tmp_path, CFG, 1, monkeypatch) as served:
        yield served


def test_a_client_reusing_its_connection_while_another_waits_is_answered(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """The only slot is held by a review whose body is still to come; a
    bare connect waits for it. The review's answer says `Connection:
    close`, so the client's next review goes on a new connection (which
    the bare connect, awaiting its headers, makes way for) and is answered,
    rather than sent on one closed under it."""
    readers = Readers(monkeypatch)
    client = served.https()
    client.putrequest("POST", f"/{admission.MUTATE_ID}?timeout=5s")
    client.putheader("Content-Type", "application/json")
    client.putheader("Content-Length", str(len(REVIEW)))
    client.endheaders()
    readers.wait_for(1)  # headers in: the slot is not given up
    waiting = served.bare()
    try:
        served.until_a_connection_waits()
        assert client.sock is not None
        client.sock.sendall(REVIEW)
        response = client.getresponse()
        assert (response.status, json.loads(response.read())) == allowed("u-1")
        assert response.getheader("Connection") == "close"
        # As a client does: the same connection object, reused unless told to close.
        assert valid_review(client, "u-2", "?timeout=5s") == allowed("u-2")
    finally:
        client.close()
        waiting.close()


def test_a_kept_alive_connection_is_closed_when_its_next_request_is_not_in_by_idle_s(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """Answered and kept alive, a connection then sending its next request
    line a byte at a time, each well within a read's timeout, is closed
    while the bytes still come: IDLE_S bounds the line and headers whole."""
    monkeypatch.setattr(connection, "IDLE_S", 1.0)
    client = served.https()
    try:
        assert valid_review(client, "u-1", "?timeout=5s") == allowed("u-1")
        assert client.sock is not None  # kept alive
        sock = client.sock
        line = f"POST /{admission.MUTATE_ID}?timeout=5s HTTP/1.1\r\n".encode()
        trickle_s = connection.IDLE_S / 5
        sock.settimeout(trickle_s)
        sent = 0
        while sent < len(line):
            try:
                closed = sock.recv(4096) == b""
                break
            except TimeoutError:
                sock.sendall(line[sent:sent + 1])
                sent += 1
        else:
            pytest.fail(f"still open after the whole request line, {sent} bytes")
        assert closed, "answered, not closed"
        assert sent >= 2, sent  # bytes came after the answer, and did not keep it open
    finally:
        client.close()
