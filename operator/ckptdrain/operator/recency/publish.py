"""Checkpoint recency onto the workloads: the operator's thin edge of
recency/document.py and recency/owners.py.

A policy's live writer pods name their controllers (an index keeps one
reference per pod). One coalesced pass per policy, at most one every
PUBLISH_DELAY_S whatever the number of pods or checkpoints, builds the
document from the policy's status and records, walks each controller up to
the workload that owns it (once per controller: owners do not change), and
merge-patches the one annotation on that workload, and on the Kueue
Workloads it (or an object on the way to it) owns, only where the value
differs from what the object holds.
A step that moves a tier costs each workload one write, or none when it
lands in the same pass as the previous one; never one per pod or record.

Failures (a refusal, a workload gone, a conflict) are logged once per
object and the pass retried after RETRY_S: records and status never wait
for this. A policy without live pods publishes nothing; a workload whose
last live pod is gone loses its metrics (its annotation stays, as written).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

import kopf

from ckptdrain.contract import api
from ckptdrain.operator.apiserver import kube, leadership, workload_objects
from ckptdrain.operator.coalesce import Coalescer
from ckptdrain.operator.recency import document, owners
from ckptdrain.operator.recency import metrics as recency_metrics

Key = tuple[str, str]
POLICIES = (api.GROUP, api.VERSION, api.POLICIES)
INJECTED = {api.ANNOTATION_INJECTED: kopf.PRESENT}
#: The pass runs this long after the first event that asks for it, so a
#: checkpoint's burst (a record and a status patch per tier, per step) is
#: one write per workload, and no workload is written more often than this.
PUBLISH_DELAY_S = 5.0
#: A pass that could not write everything (a refusal, the apiserver away)
#: is tried again after this.
RETRY_S = 60.0
#: Kueue's Workload, looked for once; when absent, again after this long (a
#: Kueue installed later is noticed without a restart).
KUEUE_GROUP, KUEUE_PLURAL = "kueue.x-k8s.io", "workloads"
DISCOVERY_S = 600.0

log = logging.getLogger(__name__)
_passes = Coalescer("publishing checkpoint recency", RETRY_S, workers=2)
_lock = threading.Lock()
#: Per policy: each controller's (by uid) workload, as walked once.
_tops: dict[Key, dict[str, owners.Owner | None]] = {}
#: Per policy: the Kueue Workloads last found for its workloads.
_queued: dict[Key, list[owners.Owner]] = {}
#: Per object (uid): the annotation value it holds, as last written.
_written: dict[str, str] = {}
#: Per policy: the workloads whose metrics are set.
_measured: dict[Key, set[recency_metrics.Workload]] = {}
#: (uid, what went wrong): logged already.
_logged: set[tuple[str, str]] = set()
#: Per pod (uid): the policy and controller last seen, to ask for a pass
#: only when a pod brings or takes away a workload.
_pods: dict[str, tuple[Key, str]] = {}
_kueue: tuple[float, str | None] | None = None


def _live_controller(meta: Any, status: Any) -> owners.Ref | None:
    """A writer pod's controller while it runs; None for a reader, a pod
    leaving or finished (it publishes nothing more)."""
    if meta.get("deletionTimestamp") or api.is_reader(meta.get("labels")) \
            or (status or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    return owners.controller_of(meta)


@kopf.index("v1", "pods", annotations=INJECTED)
def recency_owner_index(namespace: str, meta: kopf.Meta, status: kopf.Status,
                        **_: Any) -> dict[Key, owners.Ref]:
    """Each live writer pod's controller, by policy. Empty, not None, for
    one that stopped: Kopf keeps an entry when an indexer returns None."""
    ref = _live_controller(meta, status)
    if ref is None:
        return {}
    return {(namespace, (meta.get("annotations") or {}).get(api.ANNOTATION_POLICY, "")): ref}


@kopf.on.event("v1", "pods", annotations=INJECTED)
def pod_recency_event(event: kopf.RawEvent, meta: kopf.Meta, status: kopf.Status,
                      namespace: str, memo: kopf.Memo, logger: logging.Logger,
                      recency_owner_index: kopf.Index[Key, Any],
                      checkpointpolicy_index: kopf.Index[Key, Any],
                      checkpoint_index: kopf.Index[Key, Any], **_: Any) -> None:
    """A pod that brings a workload (or takes the last of one away) asks
    for a pass; a pod's other events (most of them) cost nothing here."""
    if not memo.config.publish_recency:
        return
    key = (namespace, (meta.get("annotations") or {}).get(api.ANNOTATION_POLICY, ""))
    uid = meta.get("uid", "")
    ref = None if event.get("type") == "DELETED" else _live_controller(meta, status)
    now = None if ref is None else (key, ref.uid)
    with _lock:
        before = _pods.pop(uid, None)
        if now is not None:
            _pods[uid] = now
    if before != now:
        schedule(key, logger, checkpointpolicy_index, recency_owner_index, checkpoint_index)


@kopf.on.event(*POLICIES)
def checkpointpolicy_recency_event(event: kopf.RawEvent, namespace: str, name: str,
                                   memo: kopf.Memo, logger: logging.Logger,
                                   recency_owner_index: kopf.Index[Key, Any],
                                   checkpointpolicy_index: kopf.Index[Key, Any],
                                   checkpoint_index: kopf.Index[Key, Any],
                                   **_: Any) -> None:
    """The status moved (a new step in a tier): a pass, coalesced."""
    if not memo.config.publish_recency:
        return
    key = (namespace, name)
    if event.get("type") == "DELETED":
        forget(key)
        return
    schedule(key, logger, checkpointpolicy_index, recency_owner_index, checkpoint_index)


def schedule(key: Key, logger: logging.Logger, policies: kopf.Index[Key, Any],
             pods: kopf.Index[Key, Any], checkpoints: kopf.Index[Key, Any],
             delay: float = PUBLISH_DELAY_S) -> None:
    def run() -> None:
        again = publish(key, _first(policies, key), _values(pods, key),
                        _values(checkpoints, key), logger)
        if again is not None:
            schedule(key, logger, policies, pods, checkpoints, again)

    _passes.schedule(key, run, logger, delay)


def _values(index: kopf.Index[Key, Any], key: Key) -> list[Any]:
    return [v for v in index.get(key, []) if v is not None]


def _first(index: kopf.Index[Key, Any], key: Key) -> dict[str, Any] | None:
    return next(iter(_values(index, key)), None)


def publish(key: Key, policy: dict[str, Any] | None, refs: Iterable[owners.Ref],
            records: list[dict[str, Any]], logger: logging.Logger) -> float | None:
    """One pass for a policy; the delay after which it wants another (an
    object not written, a step whose time is not at hand yet), or None."""
    by_uid = {r.uid: r for r in refs}
    if policy is None or not by_uid:
        _measure(key, set(), None)
        return None
    doc = document.document(key[1], policy.get("status") or {}, records)
    text = document.encode(doc)
    found, unresolved = _workloads(key, by_uid, logger)
    targets = list(found.values())
    with _lock:
        queued = list(_queued.get(key, []))
    failed = unresolved
    if any(_held(t) != text for t in [*targets, *queued]):
        try:
            queued = _kueue_workloads(key[0], {u for o in targets for u in o.chain})
        except (kube.ApiException, kube.HTTPError) as error:
            failed |= _once(f"kueue:{key[0]}", "list", logger,
                            "Kueue Workloads in %s could not be listed: %s", key[0], error)
        with _lock:
            _queued[key] = queued
        for target in [*targets, *queued]:
            if _held(target) != text:
                failed |= not _write(key[0], target, text, logger)
    _measure(key, {(key[0], o.kind, o.name) for o in targets}, doc)
    waiting = any(s is not None and d not in doc
                  for d, s in document.surviving_steps(policy.get("status") or {}).items())
    if failed:
        return RETRY_S
    return PUBLISH_DELAY_S if waiting else None


def _held(target: owners.Owner) -> str | None:
    with _lock:
        return _written.get(target.uid, target.annotation)


def _workloads(key: Key, refs: dict[str, owners.Ref], logger: logging.Logger
               ) -> tuple[dict[str, owners.Owner], bool]:
    """The workloads (by uid) above these controllers, each walked once;
    and whether a walk could not be answered (tried again next pass)."""
    with _lock:
        known = dict(_tops.get(key, {}))
    walked: dict[str, owners.Owner | None] = {}
    unresolved = False
    for uid, ref in refs.items():
        if uid in known:
            walked[uid] = known[uid]
            continue
        try:
            walked[uid] = owners.top_owner(key[0], ref, workload_objects.read,
                                           document.ANNOTATION_RECENCY)
        except (kube.ApiException, kube.HTTPError) as error:
            unresolved |= _once(uid, "walk", logger, "the owner of %s %s/%s could not be "
                                "read: %s", ref.kind, key[0], ref.name, error)
    with _lock:
        _tops[key] = walked
    return {o.uid: o for o in walked.values() if o is not None}, unresolved


def _kueue_workloads(namespace: str, owner_uids: set[str]) -> list[owners.Owner]:
    """The Kueue Workloads that name one of these objects (the workloads and
    what lies between them and the pods) as owner; [] where Kueue is not
    installed."""
    global _kueue
    now = time.monotonic()
    if _kueue is None or (_kueue[1] is None and now - _kueue[0] > DISCOVERY_S):
        _kueue = (now, workload_objects.served_version(KUEUE_GROUP, KUEUE_PLURAL))
    version = _kueue[1]
    if version is None or not owner_uids:
        return []
    out = []
    for w in workload_objects.list_in(version, KUEUE_PLURAL, namespace):
        meta = w.get("metadata") or {}
        if any(owners.names_owner(w, uid) for uid in owner_uids):
            value = (meta.get("annotations") or {}).get(document.ANNOTATION_RECENCY)
            out.append(owners.Owner(version, "Workload", KUEUE_PLURAL, meta.get("name", ""),
                                    meta.get("uid", ""),
                                    value if isinstance(value, str) else None))
    return out


def _write(namespace: str, target: owners.Owner, text: str, logger: logging.Logger) -> bool:
    """Patch the annotation; False when it should be tried again."""
    try:
        there = workload_objects.annotate(target.api_version, target.plural, namespace,
                                          target.name, document.ANNOTATION_RECENCY, text)
    except (kube.ApiException, kube.HTTPError) as error:
        return not _once(target.uid, "write", logger, "%s %s/%s: checkpoint recency not "
                         "published: %s", target.kind, namespace, target.name, error)
    with _lock:
        _logged.discard((target.uid, "write"))
        if there:
            _written[target.uid] = text
    return True


def _once(uid: str, what: str, logger: logging.Logger, message: str, *args: Any) -> bool:
    """Log a failure the first time it happens to an object; True (retry)."""
    with _lock:
        first = (uid, what) not in _logged
        _logged.add((uid, what))
    if first:
        logger.warning(message, *args)
    return True


def _measure(key: Key, workloads: set[recency_metrics.Workload],
             doc: dict[str, Any] | None) -> None:
    with _lock:
        gone = _measured.get(key, set()) - workloads
        _measured[key] = workloads
        if not workloads:
            _measured.pop(key, None)
    for workload in gone:
        recency_metrics.forget(workload)
    if doc is not None:
        for workload in workloads:
            recency_metrics.publish(workload, doc)


def forget(key: Key) -> None:
    """A deleted policy: its workloads' metrics and what is kept for it."""
    _measure(key, set(), None)
    with _lock:
        for owner in (_tops.pop(key, None) or {}).values():
            if owner is not None:
                _written.pop(owner.uid, None)
        for owner in _queued.pop(key, []):
            _written.pop(owner.uid, None)


def _new_term() -> None:
    """Another replica may have written the annotations while this one stood by."""
    with _lock:
        _written.clear()
        _tops.clear()
        _queued.clear()


leadership.on_new_term(_new_term)
