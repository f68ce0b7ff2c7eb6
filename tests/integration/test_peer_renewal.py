"""A renewed peer certificate is taken up by running agents, without a
restart: the files are swapped the way the kubelet swaps a mounted Secret
(one `..data` symlink), and the next connection of a running server and of a
running client uses the new certificate. An agent whose certificate has
ended talks again as soon as the renewed one lands."""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509

from ckptdrain.node.localtier import LocalTier
from ckptdrain.operator.peers import certs as peer_certs
from ckptdrain.peer.area import PartnerArea
from ckptdrain.peer.client import PeerClient, PeerUnavailable
from ckptdrain.peer.server import PeerServer
from ckptdrain.peer.tls import PeerCredentials

POLICY = "ns/train"


def mount(directory: Path, material: dict[str, bytes], generation: str) -> None:
    """Write `material` as the kubelet does: a new timestamped directory, then
    one atomic swap of the `..data` link the files point through."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"..{generation}"
    target.mkdir()
    for name in peer_certs.POD_KEYS:
        (target / name).write_bytes(material[name])
    link = directory / "..data_tmp"
    link.symlink_to(target.name)
    os.replace(link, directory / "..data")
    for name in peer_certs.POD_KEYS:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")


def served_serial(port: int, creds: PeerCredentials) -> int:
    """The serial of the certificate the server presents now."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            creds.client_context().wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def serial(material: dict[str, bytes]) -> int:
    return x509.load_pem_x509_certificate(material["tls.crt"]).serial_number


@pytest.fixture
def ca() -> dict[str, bytes]:
    return peer_certs.new_ca(POLICY, datetime.now(UTC))


def _server(tmp_path: Path, creds: PeerCredentials) -> Iterator[PeerServer]:
    srv = PeerServer(("127.0.0.1", 0), PartnerArea(tmp_path / "area", writers=2, keep=2),
                     creds)
    srv.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_a_running_server_and_client_take_up_the_renewed_certificate(
        tmp_path: Path, ca: dict[str, bytes]) -> None:
    now = datetime.now(UTC)
    first, renewed = peer_certs.issue(POLICY, ca, now), peer_certs.issue(POLICY, ca, now)
    server_dir, client_dir = tmp_path / "server", tmp_path / "client"
    mount(server_dir, first, "2026_1")
    mount(client_dir, first, "2026_1")
    server_creds = PeerCredentials(server_dir, POLICY)
    client_creds = PeerCredentials(client_dir, POLICY)
    gen = _server(tmp_path, server_creds)
    srv = next(gen)
    try:
        client = PeerClient(f"127.0.0.1:{srv.port}", client_creds)
        assert client.steps(0) == []
        assert served_serial(srv.port, client_creds) == serial(first)
        mount(server_dir, renewed, "2026_2")  # the server's node refreshed first
        assert served_serial(srv.port, client_creds) == serial(renewed)
        # One CA: an old certificate and a new one trust each other.
        assert client.steps(0) == []
        mount(client_dir, renewed, "2026_2")
        assert client.steps(1) == []
        assert served_serial(srv.port, client_creds) == serial(renewed)
    finally:
        next(gen, None)


def test_an_ended_certificate_stops_the_tier_until_the_renewal_lands(
        tmp_path: Path, ca: dict[str, bytes]) -> None:
    """What renewal prevents, and that it needs no restart to heal."""
    now = datetime.now(UTC)
    ended = peer_certs.issue(POLICY, ca, now - peer_certs.CERT_LIFETIME - timedelta(days=1))
    renewed = peer_certs.issue(POLICY, ca, now)
    mount(tmp_path / "server", ended, "2025_1")
    mount(tmp_path / "client", renewed, "2026_1")
    server_creds = PeerCredentials(tmp_path / "server", POLICY)
    gen = _server(tmp_path, server_creds)
    srv = next(gen)
    try:
        client = PeerClient(f"127.0.0.1:{srv.port}", PeerCredentials(tmp_path / "client",
                                                                     POLICY))
        with pytest.raises((PeerUnavailable, ssl.SSLError)):
            client.steps(0)
        mount(tmp_path / "server", renewed, "2026_1")
        assert client.steps(0) == []
    finally:
        next(gen, None)


def test_a_swap_that_does_not_load_keeps_the_last_good_certificate(
        tmp_path: Path, ca: dict[str, bytes]) -> None:
    now = datetime.now(UTC)
    good = peer_certs.issue(POLICY, ca, now)
    mount(tmp_path / "server", good, "2026_1")
    creds = PeerCredentials(tmp_path / "server", POLICY)
    gen = _server(tmp_path, creds)
    srv = next(gen)
    try:
        client_dir = tmp_path / "client"
        mount(client_dir, good, "2026_1")
        client_creds = PeerCredentials(client_dir, POLICY)
        other = peer_certs.issue(POLICY, ca, now)
        # A certificate with another certificate's key: does not load.
        mount(tmp_path / "server", {**good, "tls.key": other["tls.key"]}, "2026_2")
        assert served_serial(srv.port, client_creds) == serial(good)
        assert PeerClient(f"127.0.0.1:{srv.port}", client_creds).steps(0) == []
    finally:
        next(gen, None)


def test_a_step_pushed_before_the_renewal_is_fetched_after_it(
        tmp_path: Path, ca: dict[str, bytes]) -> None:
    now = datetime.now(UTC)
    first, renewed = peer_certs.issue(POLICY, ca, now), peer_certs.issue(POLICY, ca, now)
    for side in ("server", "client"):
        mount(tmp_path / side, first, "2026_1")
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.bin").write_bytes(b"m" * 4096)
    tier = LocalTier(tmp_path / "node-a")
    tier.capture(src, 7, writer=0, writers=2)
    gen = _server(tmp_path, PeerCredentials(tmp_path / "server", POLICY))
    srv = next(gen)
    try:
        client_creds = PeerCredentials(tmp_path / "client", POLICY)
        client = PeerClient(f"127.0.0.1:{srv.port}", client_creds)
        assert client.send_step(tier, 7, 0).new
        for side in ("server", "client"):
            mount(tmp_path / side, renewed, "2026_2")
        restored = tmp_path / "restored" / "step-7"
        manifest = client.fetch_step(0, 7, tmp_path / "restored" / ".tmp", restored,
                                     writers=2, expected=tier.manifest(7))
        assert manifest.same_content(tier.manifest(7))
        assert served_serial(srv.port, client_creds) == serial(renewed)
    finally:
        next(gen, None)
