"""The operator's side of the peer tier, pure: the peers document from the
policy's pods, the objects that carry it and the credentials, and the
recovery point on node loss.

    <policy>-ckptdrain-peers     ConfigMap, key peers.json (contract/peers.py):
                                 one small object per policy, rewritten only
                                 when the pairing or an address changes
    <policy>-ckptdrain-peer      Secret: ca.crt, tls.crt, tls.key (mounted by
                                 the policy's pods)
    ckptdrain-peer-ca-<uid>      Secret in the operator's own namespace:
                                 the policy's CA (ca.crt, ca.key), which
                                 signs each renewed certificate

(Versions before renewal kept the CA in `<policy>-ckptdrain-peer-ca`, in the
policy's namespace, where the operator cannot read it; such a Secret is left
to go with its policy.)
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from typing import Any

from ckptdrain.contract.api import LABEL_POLICY, LABEL_WRITER
from ckptdrain.contract.peers import ZONE_LABEL, Member, document
from ckptdrain.contract.record import TIERS
from ckptdrain.operator.policy.peer_tier import PEERS_KEY, peer_secret_name, peers_configmap_name
from ckptdrain.operator.records.aggregate import parse_rank, summarize

#: The pods' Secret: what peer/tls.py reads. The CA's: its key and certificate.
POD_SECRET_KEYS = ("ca.crt", "tls.crt", "tls.key")
CA_SECRET_KEYS = ("ca.crt", "ca.key")
#: Record claim states whose `tiers` still describe copies that exist.
_HELD = frozenset({"Local", "Draining", "Retrying", "Global"})


def peer_ca_store_name(uid: str) -> str:
    """The operator's own Secret keeping the CA of the policy with `uid`
    (by uid: a policy deleted and made again under its name gets a new CA)."""
    return f"ckptdrain-peer-ca-{uid}"


#: On the CA Secrets in the operator's namespace: the policy uid (the sweep
#: deletes those whose policy is gone) and, for people, the policy.
LABEL_CA_FOR = "ckptdrain.io/peer-ca-for"
#: Which installation keeps it (its peering name): the sweep of one
#: installation never deletes another's CAs.
LABEL_CA_INSTALLATION = "ckptdrain.io/peer-ca-installation"
ANNOTATION_CA_POLICY = "ckptdrain.io/peer-ca-policy"


def rank_of(pods: Iterable[Mapping[str, Any]], writers: int) -> dict[str, int]:
    """pod name -> writer rank, from the `ckptdrain.io/writer` label the webhook
    set; a policy of one writer has rank 0 without a label. A label that is not
    a rank in 0..writers-1 counts as none (the pod cannot be paired)."""
    out: dict[str, int] = {}
    for pod in pods:
        meta = pod.get("metadata", {})
        name = meta.get("name")
        label = (meta.get("labels") or {}).get(LABEL_WRITER)
        if not isinstance(name, str):
            continue
        if label is None:
            if writers == 1:
                out[name] = 0
            continue
        if isinstance(label, str) and label.isascii() and label.isdigit() \
                and int(label) < writers:
            out[name] = int(label)
    return out


def _secret(namespace: str, name: str, policy: str, data: Mapping[str, bytes],
            type_: str, owner: Mapping[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "labels": {LABEL_POLICY: policy}}
    if owner:
        meta["ownerReferences"] = [dict(owner)]
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": type_,
            "data": {k: base64.b64encode(v).decode("ascii") for k, v in sorted(data.items())}}


def pods_secret(namespace: str, policy: str, material: Mapping[str, bytes],
                owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The pods' Secret for `material` (peers/certs.issue): never `ca.key`.
    It belongs to the policy, so deleting the policy deletes it."""
    missing = [k for k in POD_SECRET_KEYS if k not in material]
    if missing:
        raise ValueError(f"peer material: missing {', '.join(missing)}")
    return _secret(namespace, peer_secret_name(policy), policy,
                   {k: material[k] for k in POD_SECRET_KEYS}, "kubernetes.io/tls", owner)


def ca_store_secret(store_namespace: str, uid: str, policy_id: str,
                    ca: Mapping[str, bytes], installation: str = "") -> dict[str, Any]:
    """The operator's Secret keeping a policy's CA (peers/certs.new_ca). No
    owner reference (owners cannot be in another namespace): the operator
    deletes it when the policy goes (peers/sync.py)."""
    missing = [k for k in CA_SECRET_KEYS if k not in ca]
    if missing:
        raise ValueError(f"peer CA: missing {', '.join(missing)}")
    body = _secret(store_namespace, peer_ca_store_name(uid), "", ca, "Opaque", None)
    body["metadata"]["labels"] = {LABEL_CA_FOR: uid} | (
        {LABEL_CA_INSTALLATION: installation} if installation else {})
    body["metadata"]["annotations"] = {ANNOTATION_CA_POLICY: policy_id}
    return body


def ca_from_secret_data(data: Mapping[str, str] | None) -> dict[str, bytes] | None:
    """The CA kept in a Secret's (base64) data; None when it holds none."""
    if not data or any(k not in data for k in CA_SECRET_KEYS):
        return None
    try:
        return {k: base64.b64decode(data[k], validate=True) for k in CA_SECRET_KEYS}
    except ValueError:
        return None


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
                    owner: Mapping[str, Any] | None = None,
                    writers: int | None = None) -> dict[str, Any]:
    """The ConfigMap holding the peers document (deterministic JSON, so an
    unchanged pairing is an unchanged object and no write)."""
    doc = document(f"{namespace}/{policy}", found, previous, writers)
    meta: dict[str, Any] = {"name": peers_configmap_name(policy), "namespace": namespace,
                            "labels": {LABEL_POLICY: policy}}
    if owner:
        meta["ownerReferences"] = [dict(owner)]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {PEERS_KEY: json.dumps(doc, sort_keys=True, separators=(",", ":"))}}


def pairs_status(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The pairing of the running writers as the policy's status shows it:
    rank -> holder rank (a writer not running keeps its entry in the document,
    not here)."""
    writers = doc.get("writers", {})
    return {rank: entry.get("holder") for rank, entry in sorted(
        writers.items(), key=lambda kv: int(kv[0])) if entry.get("node")}


def peer_status(policy: str, doc: Mapping[str, Any], expected: int,
                credentials_error: str | None = None,
                publish_error: str | None = None) -> dict[str, Any]:
    """The policy's `status.peer` block: the pairing, how many of the
    `expected` writers run and have a holder, and why when not all do (or
    why the Secrets or the ConfigMap could not be written)."""
    pairs = pairs_status(doc)
    running, paired = len(pairs), sum(1 for h in pairs.values() if h is not None)
    if credentials_error:
        reason, message = "CredentialsFailed", credentials_error
    elif publish_error:
        reason, message = "PublishFailed", publish_error
    elif running == 0:
        reason, message = "NoWriters", "no writer of this policy is running yet"
    elif paired == 0:
        reason = "NoPartner"
        message = (f"all {running} running writers share one node: no copy can be kept "
                   "on another node" if running > 1 else
                   f"one writer runs (of {expected}): there is no other node to keep its copy")
    elif paired < running or running < expected:
        reason = "Partial"
        message = (f"{paired} of {expected} writers have a holder on another node "
                   f"({running} running)")
    else:
        reason, message = "Paired", f"every writer ({running}) has a holder on another node"
    # A list, not a map: the status is merge-patched, and a map would keep the
    # ranks that went away (and drop a rank whose holder is null).
    listed = [{"writer": int(rank)} | ({} if holder is None else {"holder": holder})
              for rank, holder in pairs.items()]
    return {"enabled": True, "writers": running, "paired": paired, "reason": reason,
            "message": message, "pairs": listed, "configMap": peers_configmap_name(policy),
            "secret": peer_secret_name(policy)}


def recovery_on_node_loss(doc: Mapping[str, Any], records: Iterable[Mapping[str, Any]],
                          expected: int, local_keep: int, peer_keep: int,
                          progress: Iterable[Any] = ()) -> int | None:
    """`recovery_point_on_node_loss` from what the operator sees: the pairing
    (the peers document), the writers' claims in their pods' progress
    (records/sync.WriterProgress: pod, node, writer, steps) and, from older
    agents, in the Checkpoint records.

    Conservative where the records cannot say: a writer with no running pod
    counts only the global tier (its node is unknown); a local claim counts
    only when made on the node the writer runs on now; a writer's local and
    peer copies are only its newest `local_keep` / `peer_keep` claimed steps
    (retention removes older ones without a claim saying so); a peer claim
    counts only when it names the current holder (`peerHolder`); an Expired
    record counts nowhere."""
    writers = doc.get("writers") if isinstance(doc.get("writers"), Mapping) else {}
    node_of: dict[int, str] = {}
    holder_of: dict[int, int | None] = {}
    for key, entry in writers.items():
        rank = parse_rank(key)
        if rank is None or not isinstance(entry, Mapping) or not entry.get("node"):
            continue
        node_of[rank] = str(entry["node"])
        holder_of[rank] = parse_rank(entry.get("holder"))
    running = set(node_of)
    for rank in range(expected):
        # Not running: a node of its own that holds nothing but its loss.
        node_of.setdefault(rank, f"unknown node of writer {rank}")
    local: dict[int, set[int]] = {w: set() for w in node_of}
    peer: dict[int, set[int]] = {w: set() for w in node_of}
    complete: set[int] = set()
    expired: set[int] = set()

    def held(rank: int | None, step: int, state: object, tiers_: Iterable[str],
             node: object, peer_holder: object, peer_node: object) -> None:
        if rank not in running or state not in _HELD:
            return
        tiers = set(tiers_ or ()) & set(TIERS)
        # A local copy is on the node that claimed it: it counts only if
        # the writer still runs there (after a node loss it does not).
        if "local" in tiers and node == node_of[rank]:
            local[rank].add(step)
        # A peer copy counts only where the claim says its current holder
        # has it, on the node that holder runs on now.
        named = parse_rank(peer_holder)
        if "peer" in tiers and named is not None and named == holder_of.get(rank) \
                and peer_node == node_of.get(named):
            peer[rank].add(step)

    for rec in records:
        status = rec.get("status") or {}
        step = parse_rank((rec.get("spec") or {}).get("step"))
        if step is None:
            continue
        state = summarize(rec).state
        if state == "Expired":
            expired.add(step)
            continue
        if state == "Global":
            complete.add(step)
        for writer, claim in (status.get("writers") or {}).items():
            if isinstance(claim, Mapping):
                held(parse_rank(writer), step, claim.get("state"), claim.get("tiers") or (),
                     claim.get("node"), claim.get("peerHolder"), claim.get("peerNode"))
    for w in progress:
        for step, c in w.steps.items():
            if step not in expired:
                held(w.writer, step, c.state, c.tiers, w.node, c.peer_holder, c.peer_node)
    newest_local = {w: sorted(s, reverse=True)[:local_keep] for w, s in local.items()}
    newest_peer = {w: sorted(s, reverse=True)[:peer_keep] for w, s in peer.items()}
    return recovery_point_on_node_loss(node_of, holder_of, newest_local, newest_peer, complete)


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


def publish(namespace: str, policy: str, pods: Iterable[Mapping[str, Any]],
            node_labels: Mapping[str, Mapping[str, str]], port: int, writers: int,
            local_keep: int, peer_keep: int, records: Iterable[Mapping[str, Any]],
            previous: Mapping[str, Any] | None, owner: Mapping[str, Any] | None = None,
            credentials_error: str | None = None, progress: Iterable[Any] = ()
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """One pass of the peer tier for a policy: (the peers ConfigMap, the status
    fields `peer` and `recoveryPointOnNodeLoss`). `previous`: the document the
    ConfigMap holds now (its previous holders are kept)."""
    pods = list(pods)
    found = members(pods, node_labels, rank_of(pods, writers), port)
    configmap = peers_configmap(namespace, policy, found, previous, owner, writers)
    doc = json.loads(configmap["data"][PEERS_KEY])
    return configmap, {
        "peer": peer_status(policy, doc, writers, credentials_error),
        "recoveryPointOnNodeLoss": recovery_on_node_loss(doc, records, writers, local_keep,
                                                         peer_keep, progress)}


def status_when_off(current: Mapping[str, Any]) -> dict[str, Any] | None:
    """The status change for a policy whose peer tier is off (or invalid): None
    when the status says so already."""
    peer = current.get("peer")
    if (peer is None or peer == {"enabled": False}) \
            and current.get("recoveryPointOnNodeLoss") is None:
        return None
    # Merge patch: null removes what the tier had written.
    return {"peer": {"enabled": False, "writers": None, "paired": None, "reason": None,
                     "message": None, "pairs": None, "configMap": None, "secret": None,
                     "certificateNotAfter": None},
            "recoveryPointOnNodeLoss": None}
