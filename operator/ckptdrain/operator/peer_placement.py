"""The operator's side of the peer tier, pure: the peers document from the
policy's pods, the objects that carry it and the credentials, and the
recovery point on node loss.

    <policy>-ckptdrain-peers     ConfigMap, key peers.json (contract/peers.py):
                                 one small object per policy, rewritten only
                                 when the pairing or an address changes
    <policy>-ckptdrain-peer      Secret: ca.crt, tls.crt, tls.key (mounted by
                                 the policy's pods)
    <policy>-ckptdrain-peer-ca   Secret: ca.key (the operator's only)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ckptdrain.contract.api import LABEL_POLICY
from ckptdrain.contract.peers import ZONE_LABEL, Member, document

PEERS_KEY = "peers.json"


def peers_configmap_name(policy: str) -> str:
    return f"{policy}-ckptdrain-peers"


def peer_secret_name(policy: str) -> str:
    return f"{policy}-ckptdrain-peer"


def members(pods: Iterable[Mapping[str, Any]], node_labels: Mapping[str, Mapping[str, str]],
            rank_of: Mapping[str, int], port: int) -> list[Member]:
    """The running writers among `pods` (scheduled, with an IP and a rank; a
    rank held by two pods counts once, the newer pod's)."""
    by_rank: dict[int, tuple[str, Member]] = {}
    for pod in pods:
        meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
        name, node, ip = meta.get("name"), spec.get("nodeName"), status.get("podIP")
        rank = rank_of.get(name) if isinstance(name, str) else None
        if rank is None or not node or not ip or meta.get("deletionTimestamp"):
            continue
        zone = (node_labels.get(node) or {}).get(ZONE_LABEL)
        created = meta.get("creationTimestamp") or ""
        address = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
        if rank not in by_rank or created >= by_rank[rank][0]:
            by_rank[rank] = (created, Member(rank, node, zone, address))
    return [m for _, m in sorted(by_rank.values(), key=lambda v: v[1].rank)]


def peers_configmap(namespace: str, policy: str, found: list[Member],
                    previous: Mapping[str, Any] | None,
                    owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ConfigMap holding the peers document (deterministic JSON, so an
    unchanged pairing is an unchanged object and no write)."""
    doc = document(f"{namespace}/{policy}", found, previous)
    meta: dict[str, Any] = {"name": peers_configmap_name(policy), "namespace": namespace,
                            "labels": {LABEL_POLICY: policy}}
    if owner:
        meta["ownerReferences"] = [dict(owner)]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {PEERS_KEY: json.dumps(doc, sort_keys=True, separators=(",", ":"))}}


def pairs_status(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The pairing as the policy's status shows it: rank -> holder rank."""
    writers = doc.get("writers", {})
    return {rank: entry.get("holder") for rank, entry in sorted(
        writers.items(), key=lambda kv: int(kv[0]))}


def recovery_point_on_node_loss(
        node_of: Mapping[int, str], holder_of: Mapping[int, int | None],
        local: Mapping[int, Iterable[int]], peer: Mapping[int, Iterable[int]],
        global_steps: Iterable[int]) -> int | None:
    """The newest step the job can restore whichever single node is lost.

    `local[w]`: steps writer w holds on its own node; `peer[w]`: steps w's
    holder holds for it (on the holder's node); `global_steps`: complete in the
    store. Losing node N loses every tier on N; a step survives the loss of N
    if every writer still has it somewhere else. None: no step survives every
    single-node loss."""
    writers = sorted(node_of)
    complete = set(global_steps)
    candidates = set(complete)
    for w in writers:
        candidates |= set(local.get(w, ())) | set(peer.get(w, ()))
    nodes = set(node_of.values())

    def survives(step: int, lost: str) -> bool:
        for w in writers:
            if step in complete:
                continue
            if node_of[w] != lost and step in set(local.get(w, ())):
                continue
            holder = holder_of.get(w)
            # A holder with no running writer (no node) serves nothing.
            if holder in node_of and node_of[holder] != lost \
                    and step in set(peer.get(w, ())):
                continue
            return False
        return True

    for step in sorted(candidates, reverse=True):
        if all(survives(step, lost) for lost in nodes):
            return step
    return None
