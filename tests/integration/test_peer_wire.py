"""The peer server and client over real TLS on loopback: push a step, list and
fetch it back verified; refuse strangers; never publish a bad copy. A peer
that answers wrongly is in test_peer_wire_hostile.py."""

from __future__ import annotations

import http.client
import itertools
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.peer_wire import captured_tier as _tier
from tests.support.peer_wire import credentials as _credentials

from ckptdrain import cpus
from ckptdrain.errors import IntegrityError
from ckptdrain.node.durable import CopyAborted
from ckptdrain.node.localtier import LocalTier
from ckptdrain.peer import client as peer_client
from ckptdrain.peer import parts as peer_parts
from ckptdrain.peer import server as peer_server
from ckptdrain.peer.area import PartnerArea
from ckptdrain.peer.client import PeerClient, PeerUnavailable
from ckptdrain.peer.protocol import PeerRefused
from ckptdrain.peer.server import PeerServer, listen_address
from ckptdrain.peer.tls import PeerAuthError, PeerCredentials
from ckptdrain.ratelimit import TokenBucket


@pytest.fixture
def creds(tmp_path: Path) -> PeerCredentials:
    return _credentials(tmp_path / "secret")


@pytest.fixture
def server(tmp_path: Path, creds: PeerCredentials) -> Iterator[PeerServer]:
    area = PartnerArea(tmp_path / "node-b", writers=2, keep=2)
    srv = PeerServer(("127.0.0.1", 0), area, creds)
    srv.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_push_list_and_fetch_back_verified(tmp_path: Path, server: PeerServer,
                                           creds: PeerCredentials) -> None:
    tier = _tier(tmp_path, 40)
    client = PeerClient(f"127.0.0.1:{server.port}", creds)
    sent = client.send_step(tier, 40, 0, bucket=TokenBucket(50e6))
    assert sent.new and sent.bytes > 3 << 20
    assert client.send_step(tier, 40, 0).new is False  # already held
    assert client.steps(0) == [40]
    assert client.steps(1) == []
    restored = tmp_path / "restored" / "step-40"
    manifest = client.fetch_step(0, 40, tmp_path / "restored" / ".tmp", restored, writers=2,
                                 expected=tier.manifest(40))
    assert manifest.same_content(tier.manifest(40))
    assert (restored / "data" / "opt" / "state.bin").read_bytes() == \
        (tier.data_dir(40) / "opt" / "state.bin").read_bytes()


def test_a_fetch_reads_spans_over_several_connections(
        tmp_path: Path, server: PeerServer, creds: PeerCredentials,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With 1 MiB spans, the 3 MiB step is read over three connections, a
    ranged GET per piece, combined and verified before it is published."""
    monkeypatch.setattr(peer_parts, "MIN_SPAN", 1 << 20)
    monkeypatch.setattr(peer_client, "FETCH_STREAMS", 4)
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 4)
    tier = _tier(tmp_path, 40)
    client = PeerClient(f"127.0.0.1:{server.port}", creds)
    client.send_step(tier, 40, 0)
    asked: list[tuple[str, int, int, int]] = []
    real = peer_parts._Reader._piece

    def counted(self: Any, conn: Any, piece: peer_parts.Piece, *rest: Any) -> int:
        asked.append((threading.current_thread().name, piece.index, piece.start, piece.end))
        return real(self, conn, piece, *rest)

    monkeypatch.setattr(peer_parts._Reader, "_piece", counted)
    restored = tmp_path / "restored" / "step-40"
    client.fetch_step(0, 40, tmp_path / "restored" / ".tmp", restored, writers=2,
                      expected=tier.manifest(40))
    assert len({name for name, *_ in asked}) == 3
    covered = sorted((index, start, end) for _, index, start, end in asked)
    assert covered[0] == (0, 0, 1234) and covered[-1][2] == 3 << 20
    assert all(a[2] == b[1] for a, b in itertools.pairwise(covered[1:]))
    assert (restored / "data" / "opt" / "state.bin").read_bytes() == \
        (tier.data_dir(40) / "opt" / "state.bin").read_bytes()
    assert tier.manifest(40).same_content(LocalTier(restored.parent).manifest(40))


def test_the_part_resources_answer_as_documented(tmp_path: Path, server: PeerServer,
                                                 creds: PeerCredentials) -> None:
    tier = _tier(tmp_path, 40)
    PeerClient(f"127.0.0.1:{server.port}", creds).send_step(tier, 40, 0)
    data = tier.data_dir(40)

    def get(path: str, headers: dict[str, str] | None = None,
            method: str = "GET") -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=10,
                                           context=creds.client_context())
        try:
            conn.request(method, path, headers=headers or {})
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    status, _, body = get("/v1/copies/0/40/manifest")
    assert status == 200 and body == (tier.step_dir(40) / "manifest.json").read_bytes()
    index = [f.path for f in tier.manifest(40).files].index("opt/state.bin")
    status, headers, body = get(f"/v1/copies/0/40/files/{index}",
                                {"Range": "bytes=1000-1999"})
    assert status == 206 and headers["Content-Range"] == f"bytes 1000-1999/{3 << 20}"
    assert body == (data / "opt" / "state.bin").read_bytes()[1000:2000]
    status, _, body = get(f"/v1/copies/0/40/files/{index}")
    assert status == 200 and body == (data / "opt" / "state.bin").read_bytes()
    assert get(f"/v1/copies/0/40/files/{index}", {"Range": f"bytes={3 << 20}-{4 << 20}"}
               )[0] == 416
    assert get("/v1/copies/0/40/files/2")[0] == 404  # two files
    assert get("/v1/copies/0/41/manifest")[0] == 404
    assert get("/v1/copies/0/40/files/0", method="PUT")[0] == 405


def test_a_partner_without_parts_is_read_as_one_stream(tmp_path: Path,
                                                       creds: PeerCredentials) -> None:
    """A partner of a release before `/manifest` and `/files` (a rolling upgrade)."""
    class Older(peer_server._Handler):
        def do_GET(self) -> None:
            if self.path.endswith("/manifest") or "/files/" in self.path:
                self._refuse(PeerRefused(404, f"no such resource: {self.path!r}"))
                return
            super().do_GET()

    area = PartnerArea(tmp_path / "node-b", writers=2, keep=2)
    older = PeerServer(("127.0.0.1", 0), area, creds)
    older.RequestHandlerClass = Older
    older.start()
    try:
        tier = _tier(tmp_path, 40)
        client = PeerClient(f"127.0.0.1:{older.port}", creds)
        client.send_step(tier, 40, 0)
        assert client.manifest(0, 40, writers=2).same_content(tier.manifest(40))
        restored = tmp_path / "restored" / "step-40"
        client.fetch_step(0, 40, tmp_path / "restored" / ".tmp", restored, writers=2,
                          expected=tier.manifest(40))
        assert (restored / "data" / "opt" / "state.bin").read_bytes() == \
            (tier.data_dir(40) / "opt" / "state.bin").read_bytes()
    finally:
        older.shutdown()
        older.server_close()


def test_connections_over_the_cap_are_turned_away_before_their_handshake(
        tmp_path: Path, creds: PeerCredentials) -> None:
    """Two raw TCP connections that never handshake hold both slots; the
    third client is closed at once, not queued behind them; a slot freed
    serves again."""
    area = PartnerArea(tmp_path / "node-b", writers=2, keep=2)
    srv = PeerServer(("127.0.0.1", 0), area, creds, max_connections=2)
    srv.start()
    try:
        idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(2)]
        deadline = time.monotonic() + 10
        client = PeerClient(f"127.0.0.1:{srv.port}", creds, timeout=5)
        with pytest.raises(PeerUnavailable):
            client.steps(0)
        assert time.monotonic() < deadline and srv.turned_away >= 1
        for sock in idle:
            sock.close()
        for _ in range(50):  # the handler threads notice the closed sockets
            try:
                assert client.steps(0) == []
                break
            except PeerUnavailable:
                time.sleep(0.1)
        else:
            pytest.fail("no slot was freed after the idle connections closed")
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_connection_that_never_handshakes_is_dropped(tmp_path: Path,
                                                      creds: PeerCredentials) -> None:
    area = PartnerArea(tmp_path / "node-b", writers=2, keep=2)
    srv = PeerServer(("127.0.0.1", 0), area, creds, handshake_timeout=0.5)
    srv.start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port)) as silent:
            silent.settimeout(10)
            began = time.monotonic()
            assert silent.recv(1) == b""  # closed by the server, not by our timeout
            assert time.monotonic() - began < 5
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 in this kernel")
def test_the_listen_address_serves_ipv6_and_ipv4(tmp_path: Path,
                                                 creds: PeerCredentials) -> None:
    host, _ = listen_address(0)
    if host != "::":
        pytest.skip("IPv6 sockets cannot be bound here")
    area = PartnerArea(tmp_path / "node-b", writers=2, keep=2)
    srv = PeerServer((host, 0), area, creds)
    srv.start()
    try:
        assert PeerClient(f"127.0.0.1:{srv.port}", creds).steps(0) == []
        assert PeerClient(f"[::1]:{srv.port}", creds).steps(0) == []
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_corrupt_held_copy_is_refused_on_fetch(tmp_path: Path, server: PeerServer,
                                                 creds: PeerCredentials) -> None:
    tier = _tier(tmp_path, 40)
    client = PeerClient(f"127.0.0.1:{server.port}", creds)
    client.send_step(tier, 40, 0)
    held = server.area.tier(0).data_dir(40) / "opt" / "state.bin"
    data = bytearray(held.read_bytes())
    data[12345] ^= 1
    held.write_bytes(bytes(data))
    dest = tmp_path / "restored"
    with pytest.raises(IntegrityError, match=r"(?i)crc32c"):
        client.fetch_step(0, 40, dest / ".tmp", dest / "step-40", writers=2)
    assert not (dest / "step-40").exists() and not (dest / ".tmp").exists()


def test_another_policys_certificate_is_refused(tmp_path: Path, server: PeerServer) -> None:
    stranger = _credentials(tmp_path / "other", "ns/other")
    with pytest.raises((PeerUnavailable, ssl.SSLError, ConnectionError)):
        PeerClient(f"127.0.0.1:{server.port}", stranger).steps(0)
    assert server.area.steps(0) == []


def test_a_certificate_of_the_right_ca_for_another_name_is_refused(
        tmp_path: Path, server: PeerServer, creds: PeerCredentials) -> None:
    # Same CA files, but the client expects another policy: it refuses the server.
    confused = PeerCredentials(creds.directory, "ns/other")
    with pytest.raises(PeerAuthError):
        PeerClient(f"127.0.0.1:{server.port}", confused).steps(0)


def test_a_client_without_a_certificate_is_refused(server: PeerServer,
                                                   creds: PeerCredentials) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(cafile=str(creds.directory / "ca.crt"))
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=ctx, timeout=10)
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        conn.request("GET", "/v1/copies/0")
        conn.getresponse().read()
    conn.close()


def test_a_stopped_push_publishes_nothing(tmp_path: Path, server: PeerServer,
                                          creds: PeerCredentials) -> None:
    tier = _tier(tmp_path, 40)
    client = PeerClient(f"127.0.0.1:{server.port}", creds)
    sent_chunks = []

    def stop() -> bool:
        sent_chunks.append(1)
        return len(sent_chunks) > 3

    with pytest.raises(CopyAborted):
        client.send_step(tier, 40, 0, should_stop=stop)
    assert client.steps(0) == []


def test_a_content_length_of_non_ascii_digits_is_refused_with_411(
        server: PeerServer, creds: PeerCredentials) -> None:
    # '²' is a latin-1 header byte that str.isdigit() accepts and int() refuses.
    client = PeerClient(f"127.0.0.1:{server.port}", creds)
    conn = client._connect()
    try:
        conn.putrequest("PUT", "/v1/copies/0/1")
        conn.putheader("Content-Length", "\xb2")
        conn.endheaders()
        response = conn.getresponse()
        assert response.status == 411
    except (ConnectionError, http.client.HTTPException) as err:
        pytest.fail(f"the server dropped the connection instead of refusing: {err!r}")
    finally:
        conn.close()
