"""A policy's peer credentials and a node's local tier holding a captured
step: what the peer wire tests push, serve and fetch."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from ckptdrain.node.localtier import LocalTier
from ckptdrain.operator.peers import certs as peer_certs
from ckptdrain.peer.tls import PeerCredentials

POLICY = "ns/train"


def credentials(directory: Path, policy: str = POLICY) -> PeerCredentials:
    """A new CA and certificate for `policy`, written into `directory`."""
    peer_certs.write_material(directory, peer_certs.new_material(policy, datetime.now(UTC)))
    return PeerCredentials(directory, policy)


def captured_tier(tmp_path: Path, step: int, size: int = 3 << 20) -> LocalTier:
    """Node A's local tier with `step` captured for writer 0 of 2."""
    src = tmp_path / f"src-{step}"
    (src / "opt").mkdir(parents=True)
    (src / "opt" / "state.bin").write_bytes(bytes(range(256)) * (size // 256))
    (src / "model.bin").write_bytes(b"m" * 1234)
    tier = LocalTier(tmp_path / "node-a")
    tier.capture(src, step, writer=0, writers=2)
    return tier
