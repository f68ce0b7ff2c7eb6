"""The peer tier as a DCP reader's source, with real peer servers over mutual
TLS on loopback and a real S3 server.

A step of two writers is committed to the store; a partner ("node b") holds
writer 0's copy of it. With the local tier lacking the step, writer 0's files
come from the partner (fetched once, verified against the committed
manifest) and the store is asked only for writer 1's. A held copy with a
flipped byte, or with other content under the same step, is declined and the
store serves; so is a partner that refuses connections or never answers,
within the ask timeout. A container with the peer tier's environment gets
local -> peer -> global from `tier_sources`.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from tests.support.s3servers import S3Server, free_port

from ckptdrain.contract.peers import Member, PeerView, document, parse
from ckptdrain.dcp.peer_source import PeerSource, tier_sources
from ckptdrain.dcp.sources import GlobalSource, LocalSource, Provided, Want
from ckptdrain.dcp.verified import VerifiedFiles
from ckptdrain.node.localtier import LocalTier
from ckptdrain.operator.peers import certs as peer_certs
from ckptdrain.peer.area import PartnerArea
from ckptdrain.peer.client import PeerClient
from ckptdrain.peer.server import PeerServer
from ckptdrain.peer.tls import PeerCredentials
from ckptdrain.store.base import Store
from ckptdrain.transfer.catalog import load_checkpoint
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.scan import build_manifest

POLICY = "ns/train"
STEP = 9


@dataclass
class Setup:
    store: Store
    part: int
    sources: dict[int, Path]  # writer -> the files it saved
    creds: PeerCredentials
    server: PeerServer  # node b: holds writer 0's copies

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def file(self, writer: int, name: str) -> bytes:
        return (self.sources[writer] / name).read_bytes()

    def push(self, tmp_path: Path, source: Path) -> None:
        """Node a's agent captures `source` as writer 0's step and sends it to node b."""
        tier = LocalTier(tmp_path / f"node-a-{source.name}")
        tier.capture(source, STEP, writer=0, writers=2)
        PeerClient(self.address, self.creds).send_step(tier, STEP, 0)


@pytest.fixture
def setup(s3server: S3Server, tmp_path: Path) -> Iterator[Setup]:
    bucket, prefix = s3server.create_bucket(), "job"
    store = s3server.open_store(bucket, prefix)
    part = store.min_part_size
    sources = {0: tmp_path / "w0", 1: tmp_path / "w1"}
    for path in sources.values():
        path.mkdir()
    (sources[0] / "big.bin").write_bytes(os.urandom(part * 5 // 2))
    (sources[0] / "small.bin").write_bytes(b"small")
    (sources[1] / "other.bin").write_bytes(os.urandom(1000))
    for writer, path in sources.items():
        manifest = build_manifest(path, STEP, writer, 2, created=time.time())
        Drainer(store, part_size=part).drain(path, manifest,
                                             journal_path=tmp_path / f"journal-{writer}",
                                             cancel=threading.Event())
    secret = tmp_path / "secret"
    peer_certs.write_material(secret, peer_certs.new_material(POLICY, datetime.now(UTC)))
    creds = PeerCredentials(secret, POLICY)
    server = PeerServer(("127.0.0.1", 0), PartnerArea(tmp_path / "node-b", writers=2), creds)
    server.start()
    yield Setup(store, part, sources, creds, server)
    server.shutdown()
    server.server_close()
    s3server.delete_prefix(bucket, prefix + "/")


def _view(node_a: str, node_b: str) -> PeerView:
    """Writer 0 on node a, writer 1 on node b: each holds the other's copies."""
    members = [Member(0, "node-a", None, node_a), Member(1, "node-b", None, node_b)]
    return parse(json.dumps(document(POLICY, members)).encode(), POLICY)


class _Store(GlobalSource):
    """The store's source, noting which files it is asked for."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.asked: list[str] = []

    def provide(self, want: Want) -> Provided | None:
        self.asked.append(want.entry.path)
        return super().provide(want)


def _files(s: Setup, root: Path, *sources: object) -> VerifiedFiles:
    root.mkdir(parents=True, exist_ok=True)
    return VerifiedFiles(s.store, load_checkpoint(s.store, STEP), root,
                         sources=sources)  # type: ignore[arg-type]


EVERYTHING = {"big.bin": None, "small.bin": None, "other.bin": None}


def test_the_partner_serves_what_the_local_tier_lacks_and_the_store_is_not_asked(
        setup: Setup, tmp_path: Path) -> None:
    setup.push(tmp_path, setup.sources[0])
    empty_local = tmp_path / "local"
    empty_local.mkdir()
    peer = PeerSource(setup.creds, _view(f"127.0.0.1:{free_port()}", setup.address),
                      cache_dir=tmp_path / "cache")
    store = _Store(setup.store)
    files = _files(setup, tmp_path / "r", LocalSource({0: empty_local}), peer, store)
    files.ensure_ranges({"big.bin": [(setup.part, 1)], "small.bin": None, "other.bin": None})
    assert files.stats.files == {"big.bin": "peer", "small.bin": "peer", "other.bin": "global"}
    # Writer 1's copy is not held by anyone: the store serves it, and only it.
    assert store.asked == ["other.bin"]
    assert files.stats.global_bytes == 1000
    assert files.stats.bytes["peer"] == len(setup.file(0, "big.bin")) + 5
    for name in ("big.bin", "small.bin"):  # whole and as written
        assert (tmp_path / "r" / name).read_bytes() == setup.file(0, name)
    assert (tmp_path / "r" / "other.bin").read_bytes() == setup.file(1, "other.bin")
    assert peer.copies[(1, STEP)] is None  # declined once, not asked again
    # Closing removes the fetched copy; the source fetches again when next asked.
    files.close()
    assert list((tmp_path / "cache").iterdir()) == []
    again = _files(setup, tmp_path / "r2", peer, _Store(setup.store))
    again.ensure(["small.bin"])
    assert again.stats.files == {"small.bin": "peer"}
    again.close()


def test_a_held_copy_with_a_flipped_byte_is_declined_and_the_store_serves(
        setup: Setup, tmp_path: Path) -> None:
    setup.push(tmp_path, setup.sources[0])
    held = setup.server.area.tier(0).data_dir(STEP) / "big.bin"
    data = bytearray(held.read_bytes())
    data[len(data) // 2] ^= 0x01
    held.write_bytes(bytes(data))
    peer = PeerSource(setup.creds, _view(f"127.0.0.1:{free_port()}", setup.address),
                      cache_dir=tmp_path / "cache")
    files = _files(setup, tmp_path / "r", peer, GlobalSource(setup.store))
    files.ensure_ranges(EVERYTHING)
    assert files.stats.files == {"big.bin": "global", "small.bin": "global",
                                 "other.bin": "global"}
    assert "peer" not in files.stats.bytes
    assert (tmp_path / "r" / "big.bin").read_bytes() == setup.file(0, "big.bin")
    assert peer.copies[(0, STEP)] is None
    assert any("crc32c" in p.lower() for p in peer.problems[(0, STEP)]), peer.problems
    assert not any((tmp_path / "cache").rglob("*.bin"))  # nothing of the bad copy is kept
    files.close()


def test_a_held_copy_with_other_content_is_declined_and_the_store_serves(
        setup: Setup, tmp_path: Path) -> None:
    other = tmp_path / "other-run"
    other.mkdir()
    (other / "big.bin").write_bytes(os.urandom(4096))  # another run's step 9
    (other / "small.bin").write_bytes(b"small")
    setup.push(tmp_path, other)
    peer = PeerSource(setup.creds, _view(f"127.0.0.1:{free_port()}", setup.address),
                      cache_dir=tmp_path / "cache")
    files = _files(setup, tmp_path / "r", peer, GlobalSource(setup.store))
    files.ensure_ranges(EVERYTHING)
    assert set(files.stats.files.values()) == {"global"}
    assert (tmp_path / "r" / "big.bin").read_bytes() == setup.file(0, "big.bin")
    assert any("differs from the committed manifest" in p
               for p in peer.problems[(0, STEP)]), peer.problems
    files.close()


def test_an_unreachable_partner_is_declined_quickly_and_the_store_serves(
        setup: Setup, tmp_path: Path) -> None:
    # Nothing listens: refused at once.
    peer = PeerSource(setup.creds, _view(f"127.0.0.1:{free_port()}",
                                         f"127.0.0.1:{free_port()}"),
                      cache_dir=tmp_path / "cache")
    started = time.monotonic()
    files = _files(setup, tmp_path / "r", peer, GlobalSource(setup.store))
    files.ensure_ranges(EVERYTHING)
    assert set(files.stats.files.values()) == {"global"}
    assert peer.copies == {(0, STEP): None, (1, STEP): None}
    assert time.monotonic() - started < 5
    files.close()
    # A node that accepts connections but never answers (lost mid-handshake):
    # given up after the ask timeout, per server.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        peer = PeerSource(setup.creds, _view(address, address), ask_timeout=1.0,
                          cache_dir=tmp_path / "cache")
        started = time.monotonic()
        files = _files(setup, tmp_path / "r2", peer, GlobalSource(setup.store))
        files.ensure(["small.bin"])
        assert files.stats.files == {"small.bin": "global"}
        assert time.monotonic() - started < 8
        files.close()


def test_a_container_with_the_peer_tiers_environment_reads_local_then_peer_then_global(
        setup: Setup, tmp_path: Path) -> None:
    setup.push(tmp_path, setup.sources[0])
    peers_file = tmp_path / "peers" / "peers.json"
    peers_file.parent.mkdir()
    peers_file.write_text(json.dumps(document(POLICY, [
        Member(0, "node-a", None, f"127.0.0.1:{free_port()}"),
        Member(1, "node-b", None, setup.address)])))
    env = {"CKPTDRAIN_POLICY": POLICY, "CKPTDRAIN_PEER_CREDENTIALS": str(setup.creds.directory),
           "CKPTDRAIN_PEERS_FILE": str(peers_file)}
    sources = tier_sources(setup.store, {0: tmp_path / "local"}, cache_dir=tmp_path / "cache",
                           environ=env)
    assert [s.name for s in sources] == ["local", "peer", "global"]
    files = _files(setup, tmp_path / "r", *sources)
    files.ensure(["big.bin"])
    assert files.stats.files == {"big.bin": "peer"}
    files.close()
    # No peer tier in the environment, or one that cannot work: local -> global.
    assert [s.name for s in tier_sources(setup.store, environ={})] == ["global"]
    broken = {**env, "CKPTDRAIN_PEER_CREDENTIALS": str(tmp_path / "nowhere")}
    assert [s.name for s in tier_sources(setup.store, environ=broken)] == ["global"]
    missing = {**env, "CKPTDRAIN_PEERS_FILE": str(tmp_path / "no-peers.json")}
    assert [s.name for s in tier_sources(setup.store, environ=missing)] == ["global"]
