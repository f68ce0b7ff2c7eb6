"""Checkpoint recency onto the workloads: the operator's thin edge of
recency/document.py and recency/owners.py.

A policy's live writer pods name their controllers (an index keeps one
reference per pod). One coalesced pass per policy, at most one every
PUBLISH_DELAY_S whatever the number of pods or checkpoints, builds the
document from the policy's status and records, walks each controller up to
the workload that owns it (once per controller: owners do not change), and
merge-patches the one annotation on that workload, and on the Kueue
Workloads it (or an object on the way to it) owns, only where the value
differs from what the object holds. A step that moves a tier costs each
workload one write, or none when it lands in the same pass as the previous
one; never one per pod or record. Then recency/after_pass.py's hooks.

Failures (a refusal, a conflict, the apiserver away) are logged once per
object, and that object is left alone for RETRY_S (another policy event does
not bring it forward): records and status never wait for this. A workload
gone (404) is forgotten. A policy without live pods publishes nothing; a
workload whose last live pod is gone loses its metrics (its annotation stays).

One policy writes a workload: where the pods of two policies share one (a
JobSet's trainer Job under one, its eval Job under another), the first by
namespace/name with live writer pods under it, so that the two never
overwrite each other's value pass after pass. Only the active replica
publishes (apiserver/leadership.py); a standby clears its gauges.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import kopf

from ckptdrain.contract import api
from ckptdrain.operator.apiserver import kube, leadership, policy_edge, workload_objects
from ckptdrain.operator.coalesce import Coalescer
from ckptdrain.operator.recency import after_pass, claims, document, kueue, owners
from ckptdrain.operator.recency import metrics as recency_metrics

Key = tuple[str, str]
POLICIES = policy_edge.RESOURCE  # at v1beta1, the storage version
INJECTED = {api.ANNOTATION_INJECTED: kopf.PRESENT}
#: The pass runs this long after the first event that asks for it, so a
#: checkpoint's burst (a record and a status patch per tier, per step) is
#: one write per workload, and no workload is written more often than this.
PUBLISH_DELAY_S = 5.0
#: A pass that could not write everything (a refusal, the apiserver away)
#: is tried again after this.
RETRY_S = 60.0

log = logging.getLogger(__name__)
_passes = Coalescer("publishing checkpoint recency", RETRY_S, workers=2)
_lock = threading.Lock()
#: Per policy: each controller's (by uid) workload, as walked once.
_tops: dict[Key, dict[str, owners.Owner | None]] = {}
#: Per workload (uid): its owner chain as listed, and the Kueue Workloads
#: found for it (listed again only when the chain changes, or one is gone).
_queued: dict[str, tuple[tuple[str, ...], list[owners.Owner]]] = {}
#: Which policy writes a workload several policies' pods share.
_claims = claims.Claims()
#: Per object (uid, or "kueue:" + a workload's uid): when it last failed.
_failed: dict[str, float] = {}
#: Per object (uid): the annotation value it holds, as last written.
_written: dict[str, str] = {}
#: Per policy: the workloads whose metrics are set.
_measured: dict[Key, set[recency_metrics.Workload]] = {}
#: (uid, what went wrong): logged already.
_logged: set[tuple[str, str]] = set()
#: Per pod (uid): the policy and controller last seen, to ask for a pass
#: only when a pod brings or takes away a workload.
_pods: dict[str, tuple[Key, str]] = {}


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
    if not leadership.active():
        _standby()  # a standby's indexes are frozen: what it would write is stale
        return None
    by_uid = {r.uid: r for r in refs}
    if policy is None or not by_uid:
        _measure(key, set(), None)
        _claims.hold(key, ())
        with _lock:
            _tops.pop(key, None)
        _prune()
        after_pass.run(key, policy, [], logger)  # what was said of its Workloads goes
        return None
    status = policy.get("status") or {}
    doc = document.document(key[1], status, records)
    text = document.encode(doc)
    found, failed = _workloads(key, by_uid, logger)
    _claims.hold(key, found)
    all_queued: list[owners.Owner] = []
    known = not failed  # what is queued, unless a walk or a Kueue list failed
    for target in found.values():
        if _shared(key, target, logger):
            continue
        if _waits(f"kueue:{target.uid}"):
            failed, known = True, False
            queued: list[owners.Owner] = []
        else:
            queued, ok = _kueue_of(key[0], target, logger)
            failed, known = failed or not ok, known and ok
        all_queued.extend(queued)
        for obj in [target, *queued]:
            if _held(obj) == text:
                continue
            if _waits(obj.uid):
                failed = True  # failed a moment ago: RETRY_S, whatever asks sooner
                continue
            failed |= not _write(key[0], obj, target, text, logger)
    _measure(key, {(key[0], key[1], o.kind, o.name) for o in found.values()}, doc)
    _prune()
    if known:  # a list that failed is no news of what is queued: what was said stays
        after_pass.run(key, policy, all_queued, logger)
    waiting = any(s is not None and (doc.get(d) or {}).get("step") != s
                  for d, s in document.surviving_steps(status).items())
    if failed:
        return RETRY_S
    return PUBLISH_DELAY_S if waiting else None


def _held(target: owners.Owner) -> str | None:
    with _lock:
        return _written.get(target.uid, target.annotation)


def _waits(uid: str) -> bool:
    """Whether `uid` failed less than RETRY_S ago (left alone until then)."""
    with _lock:
        when = _failed.get(uid)
    return when is not None and time.monotonic() - when < RETRY_S


def _failing(uid: str) -> None:
    with _lock:
        _failed[uid] = time.monotonic()


def _workloads(key: Key, refs: dict[str, owners.Ref], logger: logging.Logger
               ) -> tuple[dict[str, owners.Owner], bool]:
    """The workloads (by uid) above these controllers, each walked once,
    with the union of the chains that reach each; and whether a walk could
    not be answered (tried again after RETRY_S)."""
    with _lock:
        known = dict(_tops.get(key, {}))
    walked: dict[str, owners.Owner | None] = {}
    unresolved = False
    for uid, ref in refs.items():
        if uid in known:
            walked[uid] = known[uid]
            continue
        if _waits(uid):
            unresolved = True
            continue
        try:
            walked[uid] = owners.top_owner(key[0], ref, workload_objects.read,
                                           document.ANNOTATION_RECENCY)
        except (kube.ApiException, kube.HTTPError) as error:
            _failing(uid)
            unresolved |= _once(uid, "walk", logger, "the owner of %s %s/%s could not be "
                                "read: %s", ref.kind, key[0], ref.name, error)
    with _lock:
        _tops[key] = walked
    found: dict[str, owners.Owner] = {}
    for o in walked.values():
        if o is not None:
            # Two Jobs of one JobSet reach it by two chains: its Kueue
            # Workload may name either, and the union does not flip by order.
            chain = found[o.uid].chain if o.uid in found else ()
            found[o.uid] = replace(o, chain=tuple(sorted({*chain, *o.chain})))
    return found, unresolved


def _shared(key: Key, target: owners.Owner, logger: logging.Logger) -> bool:
    """Whether another policy writes this workload (it comes first)."""
    first = _claims.writer(target.uid, key)
    if first == key:
        return False
    _once(target.uid, "shared", logger, "the pods of %s/%s are selected by policies %s "
          "and %s; its recency is %s's", target.kind, target.name, first[1], key[1],
          first[1])
    return True


def _kueue_of(namespace: str, target: owners.Owner, logger: logging.Logger
              ) -> tuple[list[owners.Owner], bool]:
    """The Kueue Workloads of a workload, listed when its chain is new; and
    False when they could not be listed."""
    with _lock:
        known = _queued.get(target.uid)
    if known is not None and known[0] == target.chain:
        return known[1], True
    try:
        queued = kueue.workloads(namespace, target.chain)
    except (kube.ApiException, kube.HTTPError) as error:
        _failing(f"kueue:{target.uid}")
        return [], not _once(f"kueue:{target.uid}", "list", logger,
                             "the Kueue Workloads of %s %s/%s could not be listed: %s",
                             target.kind, namespace, target.name, error)
    with _lock:
        _queued[target.uid] = (target.chain, queued)
        _logged.discard((f"kueue:{target.uid}", "list"))
        _failed.pop(f"kueue:{target.uid}", None)
    return queued, True


def _write(namespace: str, target: owners.Owner, workload: owners.Owner, text: str,
           logger: logging.Logger) -> bool:
    """Patch the annotation; False when it should be tried again. An
    object gone (404) is forgotten: a workload is walked to again, a Kueue
    Workload listed again, when a later pass asks."""
    try:
        there = workload_objects.annotate(target.api_version, target.plural, namespace,
                                          target.name, document.ANNOTATION_RECENCY, text)
    except (kube.ApiException, kube.HTTPError) as error:
        _failing(target.uid)
        return not _once(target.uid, "write", logger, "%s %s/%s: checkpoint recency not "
                         "published: %s", target.kind, namespace, target.name, error)
    with _lock:
        _logged.discard((target.uid, "write"))
        _failed.pop(target.uid, None)
        if there:
            _written[target.uid] = text
        else:
            _written.pop(target.uid, None)
            _queued.pop(workload.uid, None)
            if target.uid == workload.uid:
                for walked in _tops.values():
                    for uid in [u for u, o in walked.items() if o is not None
                                and o.uid == target.uid]:
                        del walked[uid]
    return True


def _once(uid: str, what: str, logger: logging.Logger, message: str, *args: Any) -> bool:
    """Log a failure the first time it happens to an object; True (retry)."""
    with _lock:
        first = (uid, what) not in _logged
        _logged.add((uid, what))
    if first:
        logger.warning(message, *args)
    return True


def _prune() -> None:
    """Keep what is remembered per object to the objects still in use: the
    controllers of live pods, the workloads above them, their Kueue
    Workloads. Whatever else a pass left (a workload finished, a pod gone)
    would otherwise stay for the life of the process."""
    with _lock:
        tops = {u for walked in _tops.values() for u in walked}
        tops |= {o.uid for walked in _tops.values() for o in walked.values() if o is not None}
        tops |= {uid for _, uid in _pods.values()}
        for uid in [u for u in _queued if u not in tops]:
            del _queued[uid]
        keep = tops | {o.uid for _, queued in _queued.values() for o in queued}
        keep |= {f"kueue:{u}" for u in tops}
        for uid in [u for u in _written if u not in keep]:
            del _written[uid]
        for uid in [u for u in _failed if u not in keep]:
            del _failed[uid]
        _claims.keep_only(keep)
        _logged.intersection_update({e for e in _logged if e[0] in keep})


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


def _standby() -> None:
    """This replica stopped publishing: its gauges would freeze at their last
    values while the active replica moves on; they go."""
    with _lock:
        keys = list(_measured)
    for key in keys:
        _measure(key, set(), None)


def forget(key: Key) -> None:
    """A deleted policy: its workloads' metrics and what is kept for it."""
    _measure(key, set(), None)
    _claims.hold(key, ())
    after_pass.forget(key)
    with _lock:
        for owner in (_tops.pop(key, None) or {}).values():
            if owner is not None:
                _written.pop(owner.uid, None)
                for queued in (_queued.pop(owner.uid, None) or ((), []))[1]:
                    _written.pop(queued.uid, None)


def _new_term() -> None:
    """Another replica may have written the annotations while this one stood by."""
    with _lock:
        _written.clear()
        _tops.clear()
        _queued.clear()
        _failed.clear()
    _claims.clear()
    kueue.forget()


leadership.on_new_term(_new_term)
