"""The agent's replicator against real peer servers on loopback: newest step
only, nothing re-sent to the same holder, everything re-sent to a new one,
and a stop that publishes nothing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ckptdrain.contract.peers import Member, PeerView, document, parse
from ckptdrain.errors import InvalidInput
from ckptdrain.node.durable import CopyAborted
from ckptdrain.node.localtier import LocalTier
from ckptdrain.operator.peers import certs as peer_certs
from ckptdrain.peer.area import PartnerArea
from ckptdrain.peer.client import PeerClient
from ckptdrain.peer.replicator import Replicator, replication_rate
from ckptdrain.peer.server import PeerServer
from ckptdrain.peer.tls import PeerCredentials

POLICY = "ns/rep"


@pytest.fixture
def creds(tmp_path: Path) -> PeerCredentials:
    peer_certs.write_material(tmp_path / "secret",
                              peer_certs.new_material(POLICY, datetime.now(UTC)))
    return PeerCredentials(tmp_path / "secret", POLICY)


@pytest.fixture
def servers(tmp_path: Path, creds: PeerCredentials) -> Iterator[list[PeerServer]]:
    started = []
    for name in ("node-b", "node-c"):
        srv = PeerServer(("127.0.0.1", 0), PartnerArea(tmp_path / name, writers=3), creds)
        srv.start()
        started.append(srv)
    yield started
    for srv in started:
        srv.shutdown()
        srv.server_close()


def _capture(tier: LocalTier, tmp_path: Path, step: int) -> None:
    src = tmp_path / f"src-{step}"
    src.mkdir()
    (src / "w.bin").write_bytes(bytes([step % 256]) * (1 << 20))
    tier.capture(src, step, writer=0, writers=3)


def _view(holder_port: int) -> PeerView:
    doc = document(POLICY, [Member(0, "a", None, "127.0.0.1:1"),
                            Member(1, "b", None, f"127.0.0.1:{holder_port}")])
    return parse(json.dumps(doc).encode(), POLICY)


def test_newest_only_once_per_holder_and_again_to_a_new_holder(
        tmp_path: Path, creds: PeerCredentials, servers: list[PeerServer]) -> None:
    tier = LocalTier(tmp_path / "node-a")
    view = [_view(servers[0].port)]
    rep = Replicator(tier, 0, lambda: view[0], lambda a: PeerClient(a, creds),
                     interval_s=60, overlap=0.1, stop=threading.Event())
    assert rep.run_once() is None  # nothing captured yet
    _capture(tier, tmp_path, 10)
    _capture(tier, tmp_path, 20)
    assert rep.lag_seconds() > 0
    sent = rep.run_once()
    assert sent is not None and (sent.step, sent.new) == (20, True)
    assert servers[0].area.steps(0) == [20]  # step 10 was superseded: never sent
    assert rep.run_once() is None and rep.lag_seconds() == 0
    view[0] = _view(servers[1].port)  # re-paired: the new holder gets the newest step
    assert rep.run_once().step == 20  # type: ignore[union-attr]
    assert servers[1].area.steps(0) == [20]


def test_a_stopped_replicator_publishes_nothing(
        tmp_path: Path, creds: PeerCredentials, servers: list[PeerServer]) -> None:
    tier = LocalTier(tmp_path / "node-a")
    _capture(tier, tmp_path, 10)
    stop = threading.Event()
    stop.set()
    rep = Replicator(tier, 0, lambda: _view(servers[0].port), lambda a: PeerClient(a, creds),
                     interval_s=60, overlap=0.1, stop=stop)
    with pytest.raises(CopyAborted):
        rep.run_once()
    assert servers[0].area.steps(0) == []


def test_the_rate_is_the_sizing_model_with_the_local_interval() -> None:
    # 6 GB per writer, local interval 5 min, overlap 10%: 6e9 / 30 s = 200 MB/s.
    assert replication_rate(6_000_000_000, 300, 0.1) == pytest.approx(200e6)
    assert replication_rate(1000, 300, 0.1) == 1e6  # never below the floor
    with pytest.raises(InvalidInput, match="interval"):
        replication_rate(1, 0, 0.1)
