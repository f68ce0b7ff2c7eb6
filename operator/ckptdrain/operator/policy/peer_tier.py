"""The policy's peer tier settings and what the webhook adds to a pod for them. Pure.

    peerTier:
      enabled: true        # off by default
      keep: 2              # copies kept per writer held on a partner
      capacity: 2TB        # bytes a partner area may hold (default: the disk's free space)

With the tier on, a pod gets (docs/peer-tier.md):

    initContainers: [prepare?, ckptdrain-peer (native sidecar), ckptdrain-restore,
                     ckptdrain-agent]
    volumes:        ckptdrain-peer-tls    Secret <policy>-ckptdrain-peer (ca.crt, tls.crt,
                                          tls.key only: never the CA key)
                    ckptdrain-peers       ConfigMap <policy>-ckptdrain-peers (peers.json)

The peer sidecar comes before restore, so that after a node loss every pod's
restore finds the surviving nodes' peer servers up. Agent, restore and the
sidecar read the same environment (peer/config.py): the credentials and the
peers document by path, both mounted read-only; credentials only by
reference, never in the pod spec.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ckptdrain import units
from ckptdrain.contract.env import Env
from ckptdrain.errors import InvalidInput

PEER = "ckptdrain-peer"
#: The peers ConfigMap's one key (peers_configmap_name below; made by peers/sync.py,
#: mounted by the patch below).
PEERS_KEY = "peers.json"
#: The peer server's port (peer/protocol.DEFAULT_PORT; the operator may not
#: import the node side, a unit test keeps the two equal).
PEER_PORT = 9109
DEFAULT_KEEP = 2
#: What spec.peerTier is expected to look like (said in v1beta1 by policy/version_messages.py).
SHAPE_EXPECTED = "{enabled: true, keep: 2, capacity: 2TB}"
TLS_DIR = "/etc/ckptdrain/peer-tls"
PEERS_DIR = "/etc/ckptdrain/peers"
PEERS_FILE = posixpath.join(PEERS_DIR, PEERS_KEY)
TLS_VOLUME, PEERS_VOLUME = "ckptdrain-peer-tls", "ckptdrain-peers"


def peers_configmap_name(policy: str) -> str:
    return f"{policy}-ckptdrain-peers"


def peer_secret_name(policy: str) -> str:
    return f"{policy}-ckptdrain-peer"


#: What the pods' Secret may hand to a pod (peers/certs.POD_KEYS).
POD_KEYS = ("ca.crt", "tls.crt", "tls.key")

Fail = Callable[[str, str, object], None]


@dataclass(frozen=True)
class PeerTier:
    enabled: bool = False
    keep: int = DEFAULT_KEEP
    #: Bytes a partner area may hold; None: the disk's free space.
    capacity: int | None = None


def not_ready(tier: PeerTier, status: Mapping[str, Any]) -> str | None:
    """Why a pod admitted now must not get the peer tier (None: it may): its
    Secret volume is required, so until the operator has reported the
    policy's Secrets (status.peer.secret, not CredentialsFailed) the pod would
    never start."""
    if not tier.enabled:
        return None
    peer = status.get("peer") if isinstance(status.get("peer"), Mapping) else {}
    if peer.get("reason") == "CredentialsFailed":
        return f"its peer Secrets could not be created ({peer.get('message') or 'no reason'})"
    if not peer.get("secret"):
        return "the operator has not reported its peer Secrets yet"
    return None


def read(raw: object, shard_bytes: float | None, fail: Fail) -> PeerTier:
    """spec.peerTier; each problem through `fail(field, expected, seen)` (fields
    relative to spec). `shard_bytes`: one writer's checkpoint, when known, so
    that a capacity that cannot hold one copy is refused at admission."""
    if raw is None:
        return PeerTier()
    if not isinstance(raw, Mapping):
        fail("peerTier", SHAPE_EXPECTED, raw)
        return PeerTier()
    enabled = raw.get("enabled", False)
    if not isinstance(enabled, bool):
        fail("peerTier.enabled", "true or false", enabled)
        enabled = False
    keep = DEFAULT_KEEP
    if raw.get("keep") is not None:
        try:
            keep = units.parse_positive_int("spec.peerTier.keep", raw["keep"])
        except InvalidInput as error:
            fail("peerTier.keep", error.expected, error.seen)
    capacity = None
    if raw.get("capacity") is not None:
        try:
            capacity = units.parse_bytes("spec.peerTier.capacity", raw["capacity"])
        except InvalidInput as error:
            fail("peerTier.capacity", error.expected, error.seen)
        else:
            least = max(1.0, shard_bytes or 0.0)
            if capacity < least:
                fail("peerTier.capacity", "at least one copy of a writer's checkpoint, "
                     f"{units.format_bytes(least, units.UP)}", raw["capacity"])
                capacity = None
    return PeerTier(enabled, keep, capacity)


def env(tier: PeerTier) -> list[dict[str, Any]]:
    """Environment of the agent, restore and peer containers ([] when off)."""
    if not tier.enabled:
        return []
    out = [{"name": Env.PEER_CREDENTIALS.value, "value": TLS_DIR},
           {"name": Env.PEERS_FILE.value, "value": PEERS_FILE},
           {"name": Env.PEER_PORT.value, "value": str(PEER_PORT)},
           {"name": Env.PEER_KEEP.value, "value": str(tier.keep)}]
    if tier.capacity is not None:
        out.append({"name": Env.PEER_CAPACITY.value, "value": str(tier.capacity)})
    return out


def volumes(tier: PeerTier, policy: str) -> list[dict[str, Any]]:
    """The Secret and the ConfigMap, by reference ([] when off)."""
    if not tier.enabled:
        return []
    return [
        # Only the pod keys, read-only for the containers' user; the Secret
        # must exist (the operator creates it with the policy): without
        # credentials there is no peer tier, and kubelet retries the mount.
        {"name": TLS_VOLUME, "secret": {
            "secretName": peer_secret_name(policy), "defaultMode": 0o444,
            "items": [{"key": k, "path": k} for k in POD_KEYS]}},
        # Optional: the document may come after the pod (the operator writes it
        # once writers run); peer/config.py treats a missing one as "no partner
        # yet", and kubelet fills the volume in when it appears.
        {"name": PEERS_VOLUME, "configMap": {
            "name": peers_configmap_name(policy), "optional": True,
            "items": [{"key": PEERS_KEY, "path": PEERS_KEY}]}},
    ]


def mounts(tier: PeerTier) -> list[dict[str, Any]]:
    """volumeMounts for the agent, restore and peer containers (read-only)."""
    if not tier.enabled:
        return []
    return [{"name": TLS_VOLUME, "mountPath": TLS_DIR, "readOnly": True},
            {"name": PEERS_VOLUME, "mountPath": PEERS_DIR, "readOnly": True}]


def sidecar_ports() -> list[dict[str, Any]]:
    """The peer sidecar's one port (it serves no metrics: the agent's stay on 9108)."""
    return [{"name": "ckptdrain-peer", "containerPort": PEER_PORT, "protocol": "TCP"}]
