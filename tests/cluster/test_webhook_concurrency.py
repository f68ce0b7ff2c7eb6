"""The hostile sample (test_webhook_payloads.py) sent from many connections
at once to the admission process, as an apiserver calls the webhook for
the many pods of one job while hostile callers post their own; and bodies
trickled in a byte at a time while valid reviews come. Each answer must be
what the same case is answered when sent alone: the same HTTP status, the
same admission or refusal (with its code), the same conversion result, the
same patch. Nothing dropped, no 5xx, the planted secret nowhere, and the
process answers a valid review afterwards.

CONNECTIONS is twice the reviews the server answers at once, and the
sample many times that, so the slots fill and empty over and over."""

from __future__ import annotations

import base64
import json
import random
import socket
import ssl
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import webhook_payloads as payloads
import webhook_probe as probe
import webhook_unread
import webhook_valid
from webhook_served import (  # noqa: F401 -- `served`: the fixture, used by name
    FUZZ,
    UNREAD,
    Served,
    assert_alive_and_clean,
    problems,
    served,
)

from ckptdrain.operator.admission import server as admission_server

CONNECTIONS = 2 * admission_server.MAX_IN_FLIGHT
#: A seeded draw of the hostile corpus and of webhook_unread.py's pods
#: (every valid case is sent): about 50 times the slots, in half the time
#: of the whole sample sent twice (it is sent whole one at a time in
#: test_webhook_payloads.py).
HOSTILE_DRAWN = 300
UNREAD_DRAWN = 100
#: Connections trickling bodies in while valid reviews come: half announce
#: a body small enough to be read holding no slot, half a large one.
TRICKLERS = 2 * admission_server.MAX_IN_FLIGHT
TRICKLE_S = 0.2


def interleaved(process: Served) -> list[payloads.Case]:
    """The valid cases and seeded draws of the hostile corpus and of the
    unread fields' cases, shuffled (seeded) so that valid and hostile
    interleave."""
    corpus = payloads.Corpus(process.namespace, FUZZ)
    rng = random.Random(payloads.SEED + 2)
    unread = list(webhook_unread.cases(iter(corpus.uid, None), process.namespace, UNREAD))
    cases = [*webhook_valid.valid_cases(corpus), *rng.sample(corpus.cases(), HOSTILE_DRAWN),
             *rng.sample(unread, UNREAD_DRAWN)]
    rng.shuffle(cases)
    return cases


def signature(answer: probe.Answer) -> tuple[Any, ...]:
    """What must not change with the load: the HTTP status; for a review,
    allowed or refused with its code, the conversion result, and the
    decoded patch."""
    try:
        response = json.loads(answer.body).get("response")
    except (ValueError, AttributeError):
        response = None
    if not isinstance(response, dict):
        return (answer.status,)
    patch = response.get("patch")
    return (answer.status, response.get("allowed"),
            (response.get("status") or {}).get("code"),
            (response.get("result") or {}).get("status"),
            json.loads(base64.b64decode(patch)) if isinstance(patch, str) else None)


def compared(cases: list[payloads.Case], alone: list[probe.Answer],
             loaded: list[probe.Answer], load: str) -> list[str]:
    """What is wrong with either answer to each case, and each case answered
    otherwise under `load` than alone."""
    failures = []
    for case, one, other in zip(cases, alone, loaded, strict=True):
        failures += [f"alone: {p}" for p in problems(case, one)]
        failures += [f"{load}: {p}" for p in problems(case, other)]
        if signature(one) != signature(other):
            failures.append(f"{case.kind} at {case.path} (uid {str(case.uid)[:40]!r}): "
                            f"{str(signature(one))[:200]} alone, "
                            f"{str(signature(other))[:200]} {load}")
    return failures


def test_the_sample_sent_concurrently_is_answered_as_when_sent_alone(
        served: Served) -> None:  # noqa: F811
    cases = interleaved(served)
    assert sum(c.expect is not None for c in cases) >= 15
    assert len(cases) > 40 * admission_server.MAX_IN_FLIGHT
    assert {c.kind for c in cases} >= {"huge values", "oversized body", webhook_unread.KIND}
    alone = [served.send(case) for case in cases]
    with ThreadPoolExecutor(CONNECTIONS) as pool:
        together = list(pool.map(served.send, cases))
    failures = compared(cases, alone, together, "concurrently")
    assert not failures, f"{len(failures)} bad answers:\n" + "\n".join(failures[:40])
    assert_alive_and_clean(served)


def _posted(process: Served, length: int, timeout: str, expect: bool) -> ssl.SSLSocket:
    """A connection that has sent a pod review's headers announcing `length`
    bytes of body (asking for `100 Continue` if `expect`), and no body."""
    raw = socket.create_connection(("127.0.0.1", process.server.port), timeout=10)
    sock = process.context.wrap_socket(raw, server_hostname="127.0.0.1")
    continuing = "Expect: 100-continue\r\n" if expect else ""
    sock.sendall(f"POST {payloads.POD_PATH}?timeout={timeout} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {length}\r\n"
                 f"{continuing}\r\n".encode())
    return sock


def _head(sock: ssl.SSLSocket) -> bytes:
    """The server's status line and headers on `sock` (its socket timeout,
    10 s, bounds each read)."""
    said = b""
    while not said.endswith(b"\r\n\r\n"):
        chunk = sock.recv(1)
        if not chunk:
            break
        said += chunk
    return said


def _large_body_slots_held(process: Served) -> bool:
    """Whether one more body over SMALL_BODY_BYTES is refused (503) for want
    of a body slot within its `?timeout=1s`."""
    sock = _posted(process, admission_server.SMALL_BODY_BYTES + 1, "1s", expect=False)
    try:
        return _head(sock).startswith(b"HTTP/1.1 503")
    finally:
        sock.close()


def _trickled_length(index: int) -> int:
    """Half the trickled bodies small enough to be read holding no slot."""
    return 1_000 if index % 2 else admission_server.SMALL_BODY_BYTES + 1


@contextmanager
def trickling(process: Served) -> Iterator[None]:
    """TRICKLERS connections announcing a pod review's body, sending it a
    byte every TRICKLE_S under the longest wait a review may ask (30 s).
    Yields once the server has read each one's headers (it answered its
    `Expect: 100-continue`) and the large ones hold every body slot (one
    more large body is refused 503), not after a guessed sleep. The server
    cuts each at its body's own deadline (a few seconds:
    admission/body.py); one cut is replaced by a new one, so that as many
    trickle throughout."""
    stop = threading.Event()
    socks: list[ssl.SSLSocket] = []
    failed: list[BaseException] = []  # the thread's end, said rather than lost

    def reopen(index: int) -> None:
        socks[index].close()
        try:
            socks[index] = _posted(process, _trickled_length(index), "30s", expect=False)
            socks[index].sendall(b"{")
        except OSError:  # closed for another as it began: tried again next round
            pass

    def trickle() -> None:
        try:
            while not stop.wait(TRICKLE_S):
                for index, sock in enumerate(socks):
                    try:
                        sock.sendall(b" ")
                    except OSError:  # cut: another takes its place
                        reopen(index)
        except BaseException as error:
            failed.append(error)
            raise

    thread = threading.Thread(target=trickle, daemon=True)
    try:
        for index in range(TRICKLERS):
            socks.append(_posted(process, _trickled_length(index), "30s", expect=True))
        for sock in socks:
            head = _head(sock)
            assert head.startswith(b"HTTP/1.1 100"), head[:200]
            sock.sendall(b"{")
        thread.start()
        assert any(_large_body_slots_held(process) for _ in range(5)), \
            "a large body was not refused 503 while the large trickled bodies arrive"
        yield
        assert thread.is_alive() and not failed, f"the trickling ended: {failed!r}"
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
        for sock in socks:
            sock.close()


def test_valid_reviews_are_answered_while_bodies_trickle_in(served: Served) -> None:  # noqa: F811
    """The large trickled bodies hold every body slot, one each, and as
    many small ones are read holding none: each valid review is still
    answered (within its own `?timeout=5s`) as when the server had nothing
    else to do."""
    cases = list(webhook_valid.valid_cases(payloads.Corpus(served.namespace, FUZZ)))
    alone = [served.send(case) for case in cases]
    with trickling(served):
        meanwhile = [served.send(case) for case in cases]
    failures = compared(cases, alone, meanwhile, "while bodies trickle in")
    assert not failures, f"{len(failures)} bad answers:\n" + "\n".join(failures[:40])
    assert_alive_and_clean(served)
