"""The peer client against a hostile peer of its own policy (gone wrong, or
compromised), a real TLS server on loopback answering whatever the test
says: every bad answer is a PeerUnavailable or an IntegrityError, never a
crash, and nothing is published."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tests.support.peer_wire import captured_tier as _tier
from tests.support.peer_wire import credentials as _credentials

from ckptdrain.errors import IntegrityError
from ckptdrain.peer.client import PeerClient, PeerUnavailable
from ckptdrain.peer.tls import PeerCredentials

#: For the hostile server: when set, called for each answer (a sequence of them).
hostile_next: list[Callable[[], bytes] | None] = [None]


@pytest.fixture
def creds(tmp_path: Path) -> PeerCredentials:
    return _credentials(tmp_path / "secret")


@pytest.fixture
def hostile(creds: PeerCredentials) -> Iterator[list[bytes]]:
    """A TLS server of this policy answering every request with the bytes the
    test puts in the list (a peer gone wrong, or a compromised one)."""
    import socket
    import threading
    answers: list[bytes] = []
    hostile_next[0] = None
    ctx = creds.server_context()
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except OSError:
                return
            try:
                with ctx.wrap_socket(raw, server_side=True) as tls:
                    tls.settimeout(5)
                    head = b""
                    while b"\r\n\r\n" not in head:
                        chunk = tls.recv(4096)
                        if not chunk:
                            break
                        head += chunk
                    tls.sendall(hostile_next[0]() if hostile_next[0] else answers[0])
            except OSError:
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    answers.append(b"")
    answers.append(str(listener.getsockname()[1]).encode())
    yield answers
    stop.set()
    listener.close()
    thread.join(5)


def _answer(status: str, body: bytes, length: str | None = None) -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Length: "
            f"{len(body) if length is None else length}\r\nConnection: close\r\n\r\n"
            ).encode() + body


@pytest.mark.parametrize("answer", [
    _answer("200 OK", b'{"nope": 1}'),
    _answer("200 OK", b'{"steps": [1, 2'),
    _answer("200 OK", b"[" * 100_000),
    b"GARBAGE\r\n\r\n",
    _answer("200 OK", b'{"steps": ["1"]}'),
])
def test_a_hostile_step_list_is_a_peer_unavailable(hostile: list[bytes], creds: PeerCredentials,
                                                   answer: bytes) -> None:
    # Anything else escapes restore's fallbacks (and kills the replicator's thread).
    hostile[0] = answer
    with pytest.raises(PeerUnavailable):
        PeerClient(f"127.0.0.1:{int(hostile[1])}", creds).steps(0)


def test_a_part_longer_than_asked_is_refused_and_nothing_published(
        tmp_path: Path, hostile: list[bytes], creds: PeerCredentials) -> None:
    """A partner that answers the manifest, then a part longer than the
    range asked for (each answer closes its connection: the client dials
    again, checking the certificate again)."""
    tier = _tier(tmp_path, 40, size=4096)
    manifest = (tier.step_dir(40) / "manifest.json").read_bytes()
    answers = iter([_answer("200 OK", manifest)] + [
        _answer("206 Partial Content", b"x" * 9000)] * 8)
    hostile[0] = b""
    hostile_next[0] = lambda: next(answers)
    client = PeerClient(f"127.0.0.1:{int(hostile[1])}", creds)
    dest = tmp_path / "restored"
    with pytest.raises((PeerUnavailable, IntegrityError)):
        client.fetch_step(0, 40, dest / ".tmp", dest / "step-40", writers=2)
    assert not (dest / "step-40").exists() and not (dest / ".tmp").exists()


def test_a_hostile_copy_stream_is_refused_not_a_crash(
        tmp_path: Path, hostile: list[bytes], creds: PeerCredentials) -> None:
    tier = _tier(tmp_path, 40, size=4096)
    from ckptdrain.peer import stream
    data, manifest = stream.read_copy(tier.step_dir(40))
    body = stream.copy_bytes(tier.step_dir(40), manifest, data)
    hostile[0] = _answer("200 OK", body, length="many")
    client = PeerClient(f"127.0.0.1:{int(hostile[1])}", creds)
    dest = tmp_path / "restored"
    with pytest.raises((PeerUnavailable, IntegrityError)):
        client.fetch_step(0, 40, dest / ".tmp", dest / "step-40", writers=2)
    assert not (dest / "step-40").exists()
    hostile[0] = b"GARBAGE\r\n\r\n"
    with pytest.raises(PeerUnavailable):
        client.manifest(0, 40, writers=2)
    with pytest.raises(PeerUnavailable):
        client.send_step(tier, 40, 0)
