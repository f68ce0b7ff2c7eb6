"""The peer tier's objects and status: the operator's thin edge of
peers/placement.py and peers/certs.py (docs/peer-tier.md).

For each policy with `spec.peerTier.enabled`, one coalesced pass (after pod
events, policy changes and checkpoint records) does:

1. the credentials: the policy's CA, kept in the Secret
   `ckptdrain-peer-ca-<policy uid>` of the operator's own namespace (made
   once; the only Secrets the operator reads), and the pods' Secret
   `<policy>-ckptdrain-peer` (ca.crt, tls.crt, tls.key; owned by the
   policy), created once and replaced whole (a PUT, which reads nothing)
   when its certificate nears its end (peer_certs.RENEW_BEFORE) or its end
   is not known (made by an older version, or left by a deleted policy of
   the same name). When the certificate ends is kept in
   `status.peer.certificateNotAfter`, so that a restarted operator knows
   without reading the Secret;
2. the peers ConfigMap `<policy>-ckptdrain-peers` from the running writers
   (the pod index) and their nodes' zone labels, written only when its
   document changes; the pairing depends only on ranks and placement, so
   unrelated events and restarts leave it alone, and a writer whose holder
   went away is re-paired in the same pass;
3. `status.peer`, `status.recoveryPointOnNodeLoss` and its metric, patched
   only when they change; a Warning `PeerTierFailed` on the policy when the
   Secrets or the ConfigMap cannot be written.

The upkeep thread (start_upkeep) runs every pass again hourly, so that a
certificate is renewed on a policy nothing happens to, checks once an hour
that each pods' Secret still exists (a create answered 409), and deletes the
CA Secrets of policies that are gone.

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
from ckptdrain.operator import metrics
from ckptdrain.operator.apiserver import kube, leadership
from ckptdrain.operator.coalesce import Coalescer
from ckptdrain.operator.peers import certs as peer_certs
from ckptdrain.operator.peers import kube as peer_kube
from ckptdrain.operator.peers import placement as peer_placement
from ckptdrain.operator.policy import peer_tier
from ckptdrain.operator.policy.spec import Policy

Key = tuple[str, str]
#: Pod events within this window cost one pass per policy.
DELAY_S = 0.5
RETRY_DELAY_S = 5.0

log = logging.getLogger(__name__)
_locks: defaultdict[Key, threading.Lock] = defaultdict(threading.Lock)
_passes = Coalescer("the peer tier", RETRY_DELAY_S)
#: Policy uids whose pods' Secret this operator created or found (since the
#: last upkeep, which clears it so that each is checked again).
_secrets: set[str] = set()
#: Policy uid → when the certificate in its pods' Secret ends, as this
#: operator wrote it (the status keeps it across restarts).
_certificates: dict[str, datetime] = {}
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
    """Another replica wrote the ConfigMaps, Secrets and statuses while this one
    stood by (and may have renewed a certificate: the status knows)."""
    _documents.clear()
    _written.clear()
    _secrets.clear()
    _certificates.clear()


leadership.on_new_term(_new_term)


@kopf.index("v1", "pods", annotations={api.ANNOTATION_INJECTED: kopf.PRESENT})
def peer_pod_index(namespace: str, name: str, meta: kopf.Meta, spec: kopf.Spec,
                   status: kopf.Status, **_: Any) -> dict[Key, dict[str, Any]]:
    """What placement needs of a running injected writer: rank label, node,
    IP. A reader serves no copies and holds none (with one writer, a pod
    without a rank label would otherwise pass for writer 0)."""
    labels = meta.get("labels") or {}
    if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed") \
            or api.is_reader(labels):
        return {}  # not None: Kopf would keep the pod's previous entry
    policy = (meta.get("annotations") or {}).get(api.ANNOTATION_POLICY, "")
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
            labels = peer_kube.node_labels(node)
            zone, read = (None, False) if labels is None else (labels.get(ZONE_LABEL), True)
            _zones[node] = (zone, read, now)
        if zone:
            out[node] = {ZONE_LABEL: zone}
    return out


def _recorded_end(status: Mapping[str, Any]) -> datetime | None:
    text = (status.get("peer") or {}).get("certificateNotAfter")
    try:
        return api.parse_timestamp(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _policy_ca(store: str, installation: str, uid: str, policy_id: str, now: datetime,
               logger: logging.Logger) -> tuple[dict[str, bytes], bool]:
    """(the policy's CA, whether it was made just now) from the CA namespace:
    made, and stored before anything it signs is handed out, when there is
    none or it would end before a new certificate. Replaced only in the
    version read (another replica's CA is never overwritten unseen)."""
    name = peer_placement.peer_ca_store_name(uid)
    for _ in range(3):
        found = peer_kube.read_own_secret_data(store, name)
        ca = peer_placement.ca_from_secret_data(found[0] if found else None)
        if ca is not None and peer_certs.ca_usable(ca, now):
            return ca, False
        fresh = peer_certs.new_ca(policy_id, now)
        body = peer_placement.ca_store_secret(store, uid, policy_id, fresh, installation)
        if found is None:
            if not peer_kube.create_secret(store, body):
                continue  # another replica made it meanwhile: use theirs
        else:
            body["metadata"]["resourceVersion"] = found[1]
            try:
                peer_kube.replace_secret(store, body)
            except kube.ApiException as error:
                if error.status == 409:
                    continue  # changed since it was read: read again
                raise
            logger.warning("the peer CA of %s was unreadable or would end within a "
                           "certificate's lifetime: replaced by a new one", policy_id)
        return fresh, True
    raise kube.ApiException(status=409, reason=f"Secret {store}/{name} keeps changing")


def _ensure_secrets(key: Key, uid: str, owner: Mapping[str, Any], store: str,
                    installation: str, recorded: datetime | None, now: datetime,
                    body: Mapping[str, Any], logger: logging.Logger
                    ) -> tuple[str | None, datetime | None]:
    """The pods' Secret, created or renewed as needed: (the error a user must
    see (RBAC, quota) or None, when its certificate ends if known)."""
    ends = _certificates.get(uid, recorded)
    due = peer_certs.renewal_due(ends, now)
    if uid in _secrets and not due:
        return None, ends
    if not store:
        return ("the operator has nowhere to keep the policy's CA: "
                "CKPTDRAIN_PEER_CA_NAMESPACE is not set"), ends
    namespace, name = key
    policy_id = f"{namespace}/{name}"
    try:
        ca, new_ca = _policy_ca(store, installation, uid, policy_id, now, logger)
        material = peer_certs.issue(policy_id, ca, now)
        secret = peer_placement.pods_secret(namespace, name, material, owner)
        if peer_kube.create_secret(namespace, secret):
            logger.info("created the peer tier's Secret for %s", policy_id)
            ends = peer_certs.not_after(material["tls.crt"])
        elif due or new_ca:
            # Its certificate ends soon, or when is not known (an older
            # version made it, or a deleted policy of this name left it for
            # the garbage collector), or its CA is gone: replaced whole, owned
            # by this policy, so that the next renewal's CA is the one the
            # pods trust.
            peer_kube.replace_secret(namespace, secret)
            previous, ends = ends, peer_certs.not_after(material["tls.crt"])
            logger.info("renewed the peer tier's certificate of %s (was ending %s%s)",
                        policy_id, previous or "at an unknown time",
                        "; with a new CA" if new_ca else "")
            kube.post_event(body, api.KIND_POLICY, "PeerCredentialsRenewed",
                            f"the peer tier's certificate was renewed"
                            f"{' with a new CA' if new_ca else ''}; it ends "
                            f"{api.timestamp(ends)}", "Normal")
    except kube.ApiException as error:
        if error.status in (403, 422):  # RBAC, or a name too long: a person must act
            return peer_kube.refused(error, "create or renew its Secrets"), ends
        raise
    _secrets.add(uid)
    if ends is not None:
        _certificates[uid] = ends
    return None, ends


def _document(key: Key, uid: str) -> str | None:
    """peers.json as last written for this policy (this uid), else None."""
    kept = _documents.get(key)
    return kept[1] if kept is not None and kept[0] == uid else None


def _previous(key: Key, uid: str) -> Mapping[str, Any] | None:
    text = _document(key, uid)
    if text is None:
        data = peer_kube.read_configmap_data(key[0], peer_tier.peers_configmap_name(key[1]))
        text = (data or {}).get(peer_tier.PEERS_KEY)
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
         logger: logging.Logger, progress: list[Any] | None = None,
         ca_namespace: str = "", installation: str = "") -> None:
    """One pass for one policy (`policy` None: invalid, the tier counts as off).
    `ca_namespace`: where the policies' CAs are kept; `installation`: this
    operator's peering name, on the CAs it keeps."""
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
        error, ends = _ensure_secrets(key, uid, owner, ca_namespace, installation,
                                      _recorded_end(current), datetime.now(UTC), body,
                                      logger) if uid and owner else (None, None)
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
        text = configmap["data"][peer_tier.PEERS_KEY]
        if unpublished is None and text != _document(key, uid):
            try:
                peer_kube.write_configmap(key[0], configmap)
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
        if ends is not None:
            wanted["peer"]["certificateNotAfter"] = api.timestamp(ends)
        if any(current.get(k) != v for k, v in wanted.items()):
            kube.patch_status(api.POLICIES, key[0], key[1], wanted)
            _written[key] = (uid, wanted)
            problem = error or unpublished
            if problem and (current.get("peer") or {}).get("reason") \
                    != wanted["peer"]["reason"]:
                kube.post_event(body, api.KIND_POLICY, "PeerTierFailed", problem)
        metrics.observe_node_loss(*key, wanted["recoveryPointOnNodeLoss"])


def _forbidden(error: kube.ApiException) -> str:
    return peer_kube.refused(error, "read or write the peers ConfigMap")


def schedule(key: Key, run: Callable[[], None], logger: logging.Logger,
             delay: float = DELAY_S) -> None:
    """`run` soon, once, however many events ask; retried after a failure."""
    _passes.schedule(key, run, logger, delay)


def forget(key: Key, uid: str | None, ca_namespace: str = "") -> None:
    """A deleted policy: its objects in its namespace go with it (owner
    references); its CA, in the operator's namespace, is deleted here (and
    by the upkeep, if this is missed)."""
    _documents.pop(key, None)
    _written.pop(key, None)
    if uid:
        _secrets.discard(uid)
        _certificates.pop(uid, None)
        if ca_namespace and leadership.active():
            _delete_ca(ca_namespace, peer_placement.peer_ca_store_name(uid))


def _delete_ca(store: str, name: str) -> None:
    try:
        peer_kube.delete_own_secret(store, name)
    except kube.ApiException as error:
        if error.status != 403:  # 403: no peer tier in this installation's RBAC
            log.warning("could not delete the peer CA Secret %s/%s: %s", store, name,
                        error.reason)


def upkeep(store: str, policy_uids: Callable[[], set[str]], installation: str = "") -> int:
    """Delete the CA Secrets of policies that are gone, and have every pods'
    Secret checked again by its next pass; the number deleted. The Secrets
    are listed before the policies are read: a CA is made only for a policy
    that exists, so none made meanwhile can be taken for an orphan."""
    _secrets.clear()
    if not store:
        return 0
    selector = peer_placement.LABEL_CA_FOR + (
        f",{peer_placement.LABEL_CA_INSTALLATION}={installation}" if installation else "")
    kept = peer_kube.own_secret_labels(store, selector)
    alive = policy_uids()
    gone = [name for name, labels in kept.items()
            if labels.get(peer_placement.LABEL_CA_FOR) not in alive]
    for name in gone:
        _delete_ca(store, name)
    if gone:
        log.info("deleted %d peer CA Secret(s) of deleted policies", len(gone))
    return len(gone)


UPKEEP_S = 3600.0
_upkeep_started = threading.Event()


def start_upkeep(store: str, installation: str, policy_uids: Callable[[], set[str]],
                 run_all: Callable[[], None],
                 period_s: float = UPKEEP_S) -> threading.Thread | None:
    """The hourly upkeep, once per process (later calls do nothing): only the
    active replica acts (a standby's indexes are not live)."""
    if _upkeep_started.is_set():
        return None
    _upkeep_started.set()

    def loop() -> None:
        while _upkeep_started.is_set():  # cleared: stop (tests)
            time.sleep(period_s)
            if not leadership.active():
                continue
            try:
                upkeep(store, policy_uids, installation)
                run_all()
            except Exception as error:  # the thread must outlive any failure
                log.warning("peer tier upkeep failed (%s: %s); next in %.0fs",
                            type(error).__name__, error, period_s)

    thread = threading.Thread(target=loop, name="ckptdrain-peer-upkeep", daemon=True)
    thread.start()
    return thread
