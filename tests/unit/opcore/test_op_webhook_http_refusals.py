"""The admission server's HTTP edge (admission/server.py) on bodies and
methods no apiserver sends: a body nested past the parser's bound, and a
method other than POST, are answered with a 4xx in JSON naming what was
wrong, never a dropped connection or a 5xx. The whole hostile sample:
tests/cluster/test_webhook_payloads.py."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from tests.support.admission_tls import Readers, allowed, serving, valid_review

from ckptdrain.operator import config
from ckptdrain.operator.admission import body as admission_body
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission import server as admission_server
from ckptdrain.operator.admission.policy_mirror import PolicyMirror

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
Connect = Callable[[], http.client.HTTPSConnection]


@pytest.fixture
def connect(tmp_path: Path) -> Iterator[Connect]:
    """A function opening a connection to the admission server on a free port."""
    reviewer = admission_process.Reviewer(CFG, PolicyMirror())
    with serving(tmp_path, CFG, reviewer) as (server, cert):
        context = ssl.create_default_context(cafile=str(cert))
        yield lambda: http.client.HTTPSConnection("127.0.0.1", server.server_address[1],
                                                  timeout=10, context=context)


@contextmanager
def trickling(conns: list[http.client.HTTPSConnection], path: str,
              length: int) -> Iterator[None]:
    """`conns` each announcing a body of `length` bytes to `path` and sending
    it a byte every 0.2 s until exit."""
    stop = threading.Event()
    for conn in conns:
        conn.putrequest("POST", path)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(length))
        conn.endheaders(b" ")

    def trickle() -> None:
        while not stop.wait(0.2):
            for conn in conns:
                assert conn.sock is not None
                conn.sock.sendall(b" ")

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        for conn in conns:
            conn.close()


@pytest.mark.parametrize("path", [f"/{admission.MUTATE_ID}", "/convert"])
def test_a_body_nested_too_deeply_is_a_400(connect: Connect, path: str) -> None:
    conn = connect()
    conn.request("POST", path, body=b"[" * 100_000 + b"]" * 100_000,
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 400
    assert json.loads(response.read()) == {
        "error": "body: expected an AdmissionReview or ConversionReview "
                 "(JSON nested too deeply)"}


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "FOO"])
def test_a_method_other_than_post_is_a_405(connect: Connect, method: str) -> None:
    conn = connect()
    conn.request(method, f"/{admission.MUTATE_ID}")
    response = conn.getresponse()
    assert response.status == 405
    assert response.getheader("Allow") == "POST"
    assert response.getheader("Content-Type") == "application/json"
    assert json.loads(response.read()) == {"error": f"method {method}: expected POST"}


def test_head_is_a_405_with_no_body(connect: Connect) -> None:
    conn = connect()
    conn.request("HEAD", f"/{admission.MUTATE_ID}")
    response = conn.getresponse()
    assert response.status == 405 and response.getheader("Allow") == "POST"
    assert response.getheader("Content-Type") == "application/json"
    assert response.read() == b""


def test_a_malformed_pod_review_is_an_http_400_with_a_status(connect: Connect) -> None:
    """A webhook failure the apiserver quotes (its failurePolicy decides),
    not a review refusing the pod."""
    conn = connect()
    conn.request("POST", f"/{admission.MUTATE_ID}", body=json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-9", "operation": "CREATE", "namespace": "ml",
                    "object": {"metadata": [], "spec": {}}}}).encode(),
        headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 400
    assert json.loads(response.read()) == {
        "apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 400,
        "reason": "BadRequest", "message": "ckptdrain admission: request.object.metadata: "
                                           "expected an object, got a list (request uid 'u-9')"}


def test_a_body_trickled_in_is_cut_at_the_reviews_deadline(connect: Connect) -> None:
    """One byte at a time, each within the socket's timeout: the review's
    deadline (its `?timeout=`) bounds the whole body, else such clients
    would hold their connections (and, sending large bodies, every body
    slot) for as long as they like."""
    conn = connect()
    conn.putrequest("POST", f"/{admission.MUTATE_ID}?timeout=1s")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", "1000")
    conn.endheaders()
    began = time.monotonic()
    assert conn.sock is not None
    conn.sock.settimeout(0.3)
    answered = b""
    for _ in range(40):  # 12 s of trickle at most
        try:
            conn.sock.sendall(b" ")
            answered = conn.sock.recv(4096)
        except TimeoutError:
            continue
        except OSError:
            break
        if answered:
            break
    took = time.monotonic() - began
    assert answered.startswith(b"HTTP/1.1 408"), answered
    assert b"(the review's deadline), got " in answered, answered
    assert took < 3, f"answered after {took:.1f}s"


def test_bodies_trickled_in_hold_no_slot_a_valid_review_needs(
        connect: Connect, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twice as many clients as there are review slots, each trickling a
    body in a byte at a time under the longest wait a review may ask for:
    a valid review sent once all of them are being read is still answered,
    not refused for want of a slot (503) when its own wait runs out. The
    same with the real process and policies:
    tests/cluster/test_webhook_concurrency.py. Their bodies' own deadline
    (admission/body.py) set far off, so that they are still arriving."""
    monkeypatch.setattr(admission_body, "BODY_S", 60.0)
    readers = Readers(monkeypatch)
    slow = [connect() for _ in range(2 * admission_server.MAX_IN_FLIGHT)]
    with trickling(slow, f"/{admission.MUTATE_ID}?timeout=30s", 1000):
        readers.wait_for(len(slow))
        answers = [valid_review(connect(), f"u-{uid}")
                   for uid in range(admission_server.MAX_IN_FLIGHT)]
    assert answers == [allowed(f"u-{uid}") for uid in range(admission_server.MAX_IN_FLIGHT)]


def test_large_bodies_trickled_in_hold_the_body_slots_and_no_more(
        connect: Connect, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bodies over SMALL_BODY_BYTES each hold a body slot while they
    arrive: with every one held by a trickled body, the next large body is
    refused (503) when its own wait runs out, while a small valid review
    is still answered. Their bodies' own deadline set far off."""
    monkeypatch.setattr(admission_body, "BODY_S", 60.0)
    readers = Readers(monkeypatch)
    large = admission_server.SMALL_BODY_BYTES + 1
    slow = [connect() for _ in range(admission_server.MAX_IN_FLIGHT)]
    with trickling(slow, f"/{admission.MUTATE_ID}?timeout=30s", large):
        readers.wait_for(admission_server.MAX_IN_FLIGHT)
        one_more = connect()
        one_more.putrequest("POST", f"/{admission.MUTATE_ID}?timeout=1s")
        one_more.putheader("Content-Type", "application/json")
        one_more.putheader("Content-Length", str(large))
        one_more.endheaders(b" ")
        refused = one_more.getresponse()
        assert (refused.status, json.loads(refused.read())) == (503, {
            "error": "too many reviews at once; no slot came free by the review's deadline "
                     "(1 s: its ?timeout=)"})
        assert valid_review(connect(), "u-small") == allowed("u-small")


def _trickle(conn: http.client.HTTPSConnection, body: bytes, per_second: int,
             limit_s: float) -> bytes:
    """`body` sent at about `per_second` bytes a second to /convert (no
    `?timeout=`, as the apiserver posts it); the answer's first bytes."""
    conn.putrequest("POST", "/convert")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders()
    sock, sent, began = conn.sock, 0, time.monotonic()
    assert sock is not None
    while sent < len(body):
        # All that is due by the next look, however late this one: a loaded
        # machine's delays are made up, not added up.
        upto = min(len(body), int((time.monotonic() - began + 0.1) * per_second))
        try:
            sock.settimeout(10)  # a send cut short by a timeout would lose track
            sock.sendall(body[sent:upto])
            sent = upto
            sock.settimeout(0.1)
            answered = sock.recv(4096)  # and waits for the next look
        except TimeoutError:
            answered = b""
        except OSError:
            break
        if answered or time.monotonic() - began > limit_s:
            return answered
    sock.settimeout(10)
    return sock.recv(4096)


def test_a_large_conversion_sent_slowly_is_read_whole(connect: Connect) -> None:
    """A 1.2 MB list at 400 KB/s (3 s: slower than the least pace a body is
    given, which its first 3 s make up for, and than any apiserver sends)
    is converted. Its body is due within 3 s and its length at 1 MiB/s
    (admission/body.py); the apiserver gives a conversion its own wait
    (no `?timeout=`, at least 30 s), which bounds it no sooner."""
    policy = {"apiVersion": "ckptdrain.io/v1alpha1", "kind": "CheckpointPolicy",
              "metadata": {"name": "p", "namespace": "ns"}, "spec": {"interval": "1d"}}
    body = json.dumps({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
                       "request": {"uid": "slow", "desiredAPIVersion": "ckptdrain.io/v1beta1",
                                   "objects": [policy] * 9_000}}).encode()
    assert 1_100_000 < len(body) < 1_300_000
    answered = _trickle(connect(), body, 400_000, 25)
    assert answered.startswith(b"HTTP/1.1 200"), answered[:300]


def test_a_conversion_trickled_past_its_wait_is_cut(connect: Connect,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission_server, "CONVERSION_TIMEOUT_S", 2.0)
    began = time.monotonic()
    answered = _trickle(connect(), b" " * 10_000, 1_000, 8)
    assert answered.startswith(b"HTTP/1.1 408"), answered
    assert b"(the review's deadline), got " in answered, answered
    assert time.monotonic() - began < 4
