"""The peer tier's objects and status: the operator's thin edge of
peer_placement.py and peer_certs.py (docs/peer-tier.md).

For each policy with `spec.peerTier.enabled`, one coalesced pass (after pod
events, policy changes and checkpoint records) does:

1. the Secrets, once per policy: `<policy>-ckptdrain-peer` (ca.crt, tls.crt,
   tls.key; mounted by the pods) and `<policy>-ckptdrain-peer-ca` (the CA key,
   mounted by nothing), both owned by the policy. Create only: the operator
   never reads a Secret, and an existing one is kept;
2. the peers ConfigMap `<policy>-ckptdrain-peers` from the running writers
   (the pod index) and their nodes' zone labels, written only when its
   document changes; the pairing depends only on ranks and placement, so
   unrelated events and restarts leave it alone, and a writer whose holder
   went away is re-paired in the same pass;
3. `status.peer`, `status.recoveryPointOnNodeLoss` and its metric, patched
   only when they change; a Warning `PeerTierFailed` on the policy when the
   Secrets or the ConfigMap cannot be written.

A restarted operator reads the ConfigMap back once (previous holders survive
restarts) and otherwise converges to the same objects.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from ckptdrain.contract import api
from ckptdrain.contract.peers import ZONE_LABEL
from ckptdrain.contract.record import owner_reference
from ckptdrain.operator import kube, leadership, metrics, peer_certs, peer_placement, peer_tier
from ckptdrain.operator.coalesce import Coalescer
from ckptdrain.operator.policy import Policy

Key = tuple[str, str]
#: Pod events within this window cost one pass per policy.
DELAY_S = 0.5
RETRY_DELAY_S = 5.0

_locks: defaultdict[Key, threading.Lock] = defaultdict(threading.Lock)
_passes = Coalescer("the peer tier", RETRY_DELAY_S)
#: Policy uids whose Secrets this operator created.
_secrets: set[str] = set()
#: The CA Secret of a policy whose pods' Secret was created but whose CA
#: Secret was not yet (kept in memory only until it is stored).
_pending_ca: dict[str, dict[str, Any]] = {}
#: peers.json as last written (or read back) per policy, with the uid of the
#: policy it was for: a pass of a deleted policy that ends after a new one of
#: the same name appeared must not make the new one skip its own write.
_documents: dict[Key, tuple[str, str]] = {}
#: status fields as last written per policy (the index may lag our own
#: patch), with the policy's uid as above.
_written: dict[Key, tuple[str, dict[str, Any]]] = {}
#: Zone label per node (None: none), and when it was read. Zones do not
#: change under a node; a node that could not be read (forbidden, not there
#: yet) is asked again after ZONE_RETRY_S.
_zones: dict[str, tuple[str | None, bool, float]] = {}
ZONE_RETRY_S = 300.0


def _new_term() -> None:
    """Another replica wrote the ConfigMaps and statuses while this one stood by."""
    _documents.clear()
    _written.clear()


leadership.on_new_term(_new_term)


@kopf.index("v1", "pods", annotations={api.ANNOTATION_INJECTED: kopf.PRESENT})
def peer_pod_index(namespace: str, name: str, meta: kopf.Meta, spec: kopf.Spec,
                   status: kopf.Status, **_: Any) -> dict[Key, dict[str, Any]]:
    """What placement needs of a running injected pod: rank label, node, IP."""
    if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return {}  # not None: Kopf would keep the pod's previous entry
    policy = (meta.get("annotations") or {}).get(api.ANNOTATION_POLICY, "")
    labels = meta.get("labels") or {}
    writer = {api.LABEL_WRITER: labels[api.LABEL_WRITER]} if api.LABEL_WRITER in labels \
        else {}
    return {(namespace, policy): {
        "metadata": {"name": name, "creationTimestamp": meta.get("creationTimestamp"),
                     "labels": writer},
        "spec": {"nodeName": spec.get("nodeName")}, "status": {"podIP": status.get("podIP")}}}


def _zone_labels(nodes: Iterable[str]) -> dict[str, dict[str, str]]:
    """The zone label of each node, read once per node (a node that cannot be
    read, being gone or forbidden, pairs by node only)."""
    out: dict[str, dict[str, str]] = {}
    now = time.monotonic()
    for node in nodes:
        zone, read, at = _zones.get(node, (None, False, -math.inf))
        if not read and now - at >= ZONE_RETRY_S:
            labels = kube.node_labels(node)
            zone, read = (None, False) if labels is None else (labels.get(ZONE_LABEL), True)
            _zones[node] = (zone, read, now)
        if zone:
            out[node] = {ZONE_LABEL: zone}
    return out


def _ensure_secrets(key: Key, uid: str, owner: Mapping[str, Any],
                    logger: logging.Logger) -> str | None:
    """Create the policy's two Secrets unless they exist; the error a user
    must see (RBAC, quota), or None."""
    if uid in _secrets:
        return None
    namespace, name = key
    try:
        ca = _pending_ca.get(uid)
        if ca is None:
            material = peer_certs.new_material(f"{namespace}/{name}", datetime.now(UTC))
            pods, ca = peer_placement.peer_secrets(namespace, name, material, owner)
            # The pods' Secret first: if it exists, the CA that signed it is
            # already kept (or lost with a crash in between), never replaced
            # by one that did not sign it.
            if not kube.create_secret(namespace, pods):
                # Exists. Not remembered: it may be a deleted policy's Secret
                # waiting for garbage collection, and once that is gone the
                # next pass must create this policy's own. A 409 is cheap.
                return None
            _pending_ca[uid] = ca  # until it is stored: a failure here retries it
        kube.create_secret(namespace, ca)
        _pending_ca.pop(uid, None)
        logger.info("created the peer tier's Secrets for %s/%s", namespace, name)
    except kube.ApiException as error:
        if error.status in (403, 422):  # RBAC, or a name too long: a person must act
            return f"the operator could not create its Secrets: {error.reason}"
        raise
    _secrets.add(uid)
    return None


def _document(key: Key, uid: str) -> str | None:
    """peers.json as last written for this policy (this uid), else None."""
    kept = _documents.get(key)
    return kept[1] if kept is not None and kept[0] == uid else None


def _previous(key: Key, uid: str) -> Mapping[str, Any] | None:
    text = _document(key, uid)
    if text is None:
        data = kube.read_configmap_data(key[0], peer_placement.peers_configmap_name(key[1]))
        text = (data or {}).get(peer_placement.PEERS_KEY)
        if text is None:
            return None
        _documents[key] = (uid, text)
    try:
        found = json.loads(text)
    except ValueError:
        return None  # rewritten from scratch: only previous holders are lost
    return found if isinstance(found, dict) else None


def sync(key: Key, policy: Policy | None, body: Mapping[str, Any],
         pods: list[Mapping[str, Any]], records: list[Mapping[str, Any]],
         logger: logging.Logger, progress: list[Any] | None = None) -> None:
    """One pass for one policy (`policy` None: invalid, the tier counts as off)."""
    with _locks[key]:
        meta = body.get("metadata") or {}
        uid = meta.get("uid") or ""
        kept = _written.get(key)
        current = kept[1] if kept is not None and kept[0] == uid else \
            (body.get("status") or {})
        if policy is None or not policy.peer.enabled:
            change = peer_placement.status_when_off(current)
            if change is not None:
                kube.patch_status(api.POLICIES, key[0], key[1], change)
                _written[key] = (uid, {"peer": {"enabled": False}})
            metrics.observe_node_loss(*key, None)
            return
        owner = owner_reference(key[1], uid) if uid else None
        error = _ensure_secrets(key, uid, owner, logger) if uid and owner else None
        nodes = {p.get("spec", {}).get("nodeName") for p in pods} - {None, ""}
        try:
            previous, unpublished = _previous(key, uid), None
        except kube.ApiException as denied:
            if denied.status != 403:
                raise
            previous, unpublished = None, _forbidden(denied)
        configmap, wanted = peer_placement.publish(
            key[0], key[1], pods, _zone_labels(sorted(nodes)), peer_tier.PEER_PORT,
            policy.writers, policy.local_keep, policy.peer.keep, records, previous,
            owner, error, progress or ())
        text = configmap["data"][peer_placement.PEERS_KEY]
        if unpublished is None and text != _document(key, uid):
            try:
                kube.write_configmap(key[0], configmap)
                _documents[key] = (uid, text)
                logger.info("published the peers of %s/%s: %s", *key,
                            wanted["peer"]["message"])
            except kube.ApiException as denied:
                if denied.status != 403:
                    raise
                unpublished = _forbidden(denied)
        if unpublished:
            # Not retried on a timer: RBAC changes come with a person, and the
            # next pod or record event tries again.
            doc = json.loads(text)
            wanted["peer"] = peer_placement.peer_status(key[1], doc, policy.writers, error,
                                                        unpublished)
        if any(current.get(k) != v for k, v in wanted.items()):
            kube.patch_status(api.POLICIES, key[0], key[1], wanted)
            _written[key] = (uid, wanted)
            problem = error or unpublished
            if problem and (current.get("peer") or {}).get("reason") \
                    != wanted["peer"]["reason"]:
                kube.post_event(body, api.KIND_POLICY, "PeerTierFailed", problem)
        metrics.observe_node_loss(*key, wanted["recoveryPointOnNodeLoss"])


def _forbidden(error: kube.ApiException) -> str:
    return ("the operator may not read or write the peers ConfigMap "
            f"({error.reason}): grant get, create and patch on configmaps")


def schedule(key: Key, run: Callable[[], None], logger: logging.Logger,
             delay: float = DELAY_S) -> None:
    """`run` soon, once, however many events ask; retried after a failure."""
    _passes.schedule(key, run, logger, delay)


def forget(key: Key, uid: str | None) -> None:
    """A deleted policy: its objects go with it (owner references)."""
    _documents.pop(key, None)
    _written.pop(key, None)
    if uid:
        _secrets.discard(uid)
        _pending_ca.pop(uid, None)
