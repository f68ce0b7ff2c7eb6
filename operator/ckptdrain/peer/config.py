"""The peer tier's settings, read from the environment the webhook sets
(contract/env.py), validated at start. The tier is off unless the pod has
the policy's peer credentials mounted (CKPTDRAIN_PEER_CREDENTIALS)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ckptdrain import units
from ckptdrain.contract import peers as pairing
from ckptdrain.contract.env import Env
from ckptdrain.errors import IntegrityError, InvalidInput
from ckptdrain.peer import protocol
from ckptdrain.peer.tls import PeerCredentials

#: The contract names this module reads (the rest are node/config.FIELDS').
READS = frozenset({Env.PEER_CREDENTIALS, Env.PEERS_FILE, Env.PEER_PORT, Env.PEER_KEEP,
                   Env.PEER_CAPACITY})


@dataclass(frozen=True)
class PeerConfig:
    credentials: PeerCredentials
    #: The mounted peers document (peer/pairing.py).
    peers_file: Path
    port: int
    #: Copies kept per writer held here.
    keep: int
    #: Bytes the partner area may hold (None: the disk's free space).
    capacity: int | None

    def view(self) -> pairing.PeerView | None:
        """The peers document as it is now (None while it is missing or malformed:
        a ConfigMap update is eventually visible, never a reason to stop)."""
        try:
            return pairing.parse(self.peers_file.read_bytes(), self.credentials.policy_id)
        except (OSError, IntegrityError):
            return None


def load(policy_id: str, environ: Mapping[str, str] | None = None) -> PeerConfig | None:
    """The peer settings, or None when the peer tier is off. Raises InvalidInput
    naming the variable on a bad value."""
    env = os.environ if environ is None else environ
    credentials = env.get(Env.PEER_CREDENTIALS, "").strip()
    if not credentials:
        return None
    if not policy_id:
        raise InvalidInput(Env.POLICY.value, "<namespace>/<name> when the peer tier is on", "")
    peers_file = env.get(Env.PEERS_FILE, "").strip()
    if not peers_file:
        raise InvalidInput(Env.PEERS_FILE.value, "the mounted peers.json", "nothing")
    port_text = env.get(Env.PEER_PORT, str(protocol.DEFAULT_PORT)).strip()
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidInput(Env.PEER_PORT.value, "a TCP port in 1..65535", port_text)
    keep = units.parse_positive_int(Env.PEER_KEEP.value, env.get(Env.PEER_KEEP, "2"))
    capacity_text = env.get(Env.PEER_CAPACITY, "").strip()
    capacity = (units.parse_bytes(Env.PEER_CAPACITY.value, capacity_text)
                if capacity_text else None)
    return PeerConfig(PeerCredentials(Path(credentials), policy_id), Path(peers_file),
                      int(port_text), keep, capacity)
