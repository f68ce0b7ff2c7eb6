"""The admission server (admission/server.py, body.py) against clients
that send their headers at once and then their body slowly: more of them
than the server has connection slots (its real 128) no longer keep a valid
review waiting, a body is due by a deadline that grows with its length,
and a body sent at once, or a large one at a realistic pace, is still
answered. The real server, over real TLS."""

from __future__ import annotations

import contextlib
import json
import re
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
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission import server as admission_server

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
#: More trickling clients than the server has connection slots.
TRICKLERS = admission_server.MAX_CONNECTIONS + 8
TRICKLE_S = 0.2


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    with served_with_slots(tmp_path, CFG, admission_server.MAX_CONNECTIONS,
                           monkeypatch) as served:
        yield served


def posted(served: Served, length: int,
           path: str = f"/{admission.MUTATE_ID}?timeout=30s") -> ssl.SSLSocket:
    """A connection that has sent a review's headers, announcing `length`
    bytes of body, and the body's first byte."""
    sock = served.tls()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n{{"
                 .encode())
    return sock


@contextmanager
def trickling(served: Served, count: int) -> Iterator[None]:
    """`count` clients each sending a 1,000-byte body a byte every TRICKLE_S
    under the longest wait a review may ask (30 s), and opening another
    connection to do it again as soon as the server closes theirs, until
    exit. Yields once every slot is held by one."""
    stop, started = threading.Event(), threading.Semaphore(0)

    def trickle() -> None:
        first = True
        while not stop.is_set():
            with contextlib.suppress(OSError), posted(served, 1000) as sock:
                if first:
                    first = False
                    started.release()
                while not stop.wait(TRICKLE_S):
                    sock.sendall(b" ")  # raises once the server has closed it

    threads = [threading.Thread(target=trickle, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    for _ in range(admission_server.MAX_CONNECTIONS):
        assert started.acquire(timeout=30), "the trickling clients did not all get in"
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def timed_review(served: Served, uid: str) -> float:
    """Seconds a valid review took to be answered (allowed) on a new connection."""
    began = time.monotonic()
    assert valid_review(served.https(), uid, "?timeout=5s") == allowed(uid)
    return time.monotonic() - began


def ended(sock: ssl.SSLSocket) -> bool:
    """Whether the server has closed `sock` (it reads its end at once)."""
    sock.settimeout(0.5)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:  # its close, as the TLS layer sees it
        return True


def test_trickled_bodies_in_every_slot_make_way_for_a_valid_review(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """More clients than slots trickle bodies in, each of its bytes well
    within a read's timeout, each opening another connection once the
    server closes theirs: valid reviews are answered within the
    apiserver's wait, a body behind the least pace closed for each, and
    none closed by the trickling clients' own new connections. Their
    deadline set far off, so that only making way can let one in."""
    monkeypatch.setattr(admission_body, "BODY_S", 60.0)
    with trickling(served, TRICKLERS):
        took = [timed_review(served, f"u-{uid}") for uid in range(3)]
    assert max(took) < APISERVER_WAIT_S - 1, took


def test_a_large_body_waiting_for_its_slot_makes_way_for_a_valid_review(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four connection slots: one holds the large conversion slot, its
    16 MiB list sent at a little over the least pace (never behind); three
    more large lists wait for that slot, none of their bytes read. A valid
    review is still answered within the apiserver's wait, one of those
    waiting closed for it, however long their own deadline."""
    monkeypatch.setattr(admission_body, "BODY_S", 60.0)
    with served_with_slots(tmp_path, CFG, 4, monkeypatch) as served:
        large = admission_server.MAX_CONVERSION_BYTES
        reading = posted(served, large, path="/convert")
        stop, failed = threading.Event(), list[OSError]()

        def keep_pace() -> None:
            per_second, sent, began = admission_body.MIN_BODY_RATE * 5 // 4, 1, time.monotonic()
            try:
                while not stop.wait(0.05):
                    # All that is due by the next look, however late this
                    # one: a loaded machine's delays are made up, not added.
                    upto = min(large - 1, int((time.monotonic() - began + 0.1) * per_second))
                    reading.sendall(b" " * max(0, upto - sent))
                    sent = max(sent, upto)
            except OSError as error:
                failed.append(error)

        pacer = threading.Thread(target=keep_pace, daemon=True)
        pacer.start()
        waiting = [posted(served, large, path="/convert") for _ in range(3)]
        try:
            assert timed_review(served, "u-1") < APISERVER_WAIT_S - 1
            assert any(map(ended, waiting))  # one waiting made way
            stop.set()
            pacer.join()
            assert failed == []  # the paced body's connection was never closed
            assert not ended(reading)  # nor, its pacer stopped, is it now
        finally:
            stop.set()
            pacer.join()
            for sock in [reading, *waiting]:
                sock.close()


def test_trickled_bodies_are_cut_at_their_paced_deadline(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """A review may ask 30 s, but a 1,000-byte body is due within BODY_S
    (and a millisecond) of its headers: trickled in, it is answered 408,
    naming what was late, while its bytes still come; so a flood of them
    holds no slot longer."""
    readers = Readers(monkeypatch)
    began = time.monotonic()
    sock = posted(served, 1000)
    try:
        readers.wait_for(1)
        sock.settimeout(TRICKLE_S)
        answered = b""
        while time.monotonic() - began < admission_body.BODY_S + 5:
            try:
                answered = sock.recv(4096)
                break
            except TimeoutError:
                sock.sendall(b" ")
        took = time.monotonic() - began
        head, _, data = answered.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answered
        assert b"Connection: close" in head
        sock.settimeout(APISERVER_WAIT_S)
        while chunk := sock.recv(4096):
            data += chunk
        error = json.loads(data)["error"]
        assert re.fullmatch(r"body: expected its 1000 bytes within 3 s of its headers \(its "
                            r"deadline: 3 s, and 1 s a MiB\), got [0-9]+", error), error
        assert admission_body.BODY_S <= took < admission_body.BODY_S + 2, took
    finally:
        sock.close()


def large_review(uid: str, size: int) -> bytes:
    """A valid pod review of about `size` bytes (a large annotation)."""
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "operation": "CREATE", "namespace": "ml",
                    "object": {"metadata": {"name": "p", "annotations": {"a": "x" * size}},
                               "spec": {"containers": [{"name": "c", "image": "i"}]}}}}).encode()


def sent_at(served: Served, body: bytes, per_second: int) -> tuple[int, object]:
    """`body` posted at about `per_second` bytes a second: the answer."""
    conn = served.https()
    conn.timeout = 30
    conn.putrequest("POST", f"/{admission.MUTATE_ID}?timeout=30s")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders()
    assert conn.sock is not None
    chunk, began = per_second // 20, time.monotonic()
    for at in range(0, len(body), chunk):
        conn.sock.sendall(body[at:at + chunk])
        time.sleep(max(0.0, began + (at + chunk) / per_second - time.monotonic()))
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def test_a_large_body_at_a_realistic_pace_is_answered_among_trickled_ones(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """While trickled bodies hold every slot, a 3 MB review sent at 2 MB/s
    (1.5 s, longer than a trickled body may fall behind) gets a slot and
    keeps it until answered, as does a small one sent at once."""
    monkeypatch.setattr(admission_body, "BODY_S", 60.0)
    body = large_review("u-large", 3_000_000)
    with trickling(served, TRICKLERS):
        began = time.monotonic()
        assert sent_at(served, body, 2_000_000) == allowed("u-large")
        took = time.monotonic() - began
        assert took < 1.5 + APISERVER_WAIT_S - 1, took
        assert timed_review(served, "u-small") < APISERVER_WAIT_S - 1
