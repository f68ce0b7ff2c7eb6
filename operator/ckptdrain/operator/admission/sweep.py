"""Nothing unprotected goes unseen: opted-in pods that carry no injection.

A pod labelled `ckptdrain.io/inject=true` that was created while admission
was off (the operator down with failurePolicy Ignore, the webhook
configuration deleted, the label added after creation) runs without restore
and is never drained. The sweep finds every such pod that a policy selects
and says so: a Warning Event on the pod (once per pod), the policy's
PodsUnprotected condition (count and a bounded list of names) and the
`ckptdrain_unprotected_pods` gauge. The remedy is to delete the pod: its
controller recreates it through admission.

An opted-in bare pod that NO policy selects (admitted under
CKPTDRAIN_UNSELECTED_PODS=Flag or while admission was off, or labelled
later; admission/unselected.py), and an injected pod whose policy was
deleted since, have no policy to report on: each gets an `Unselected`
Warning Event, and its controller (a Job, a ReplicaSet: where someone looks
when pods are created by a controller) gets one for all its pods
(admission/unselected_events.py posts them, outside the sweep's lock); they
count in `ckptdrain_unselected_pods`, whose series goes when the namespace
has none left. An injected pod is flagged only once its policy has been
missing for one watchdog period: a policy deleted and created again
(`kubectl replace --force`, a GitOps replace) is back before then.

Pods reach the operator by a server-side label selector (handlers.py sets
it), so only opted-in pods are listed and watched. The sweep runs on pod
events (coalesced per namespace) and periodically, on the active replica
only (apiserver/leadership.py): a standby's indexes are not live, so a
replica that stops reconciling drops its gauges rather than report what it
last saw.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf

from ckptdrain.contract import api
from ckptdrain.operator import metrics
from ckptdrain.operator.admission import injection, unselected, unselected_events
from ckptdrain.operator.apiserver import kube, leadership, policy_edge
from ckptdrain.operator.coalesce import Coalescer
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import identity
from ckptdrain.operator.policy import spec as pol
from ckptdrain.operator.policy import status as st

#: At v1beta1, the storage version (apiserver/policy_edge.py).
POLICIES = policy_edge.RESOURCE
OPTED_IN = {api.LABEL_INJECT: "true"}
NOT_INJECTED = {api.ANNOTATION_INJECTED: kopf.ABSENT}
INJECTED = {api.ANNOTATION_INJECTED: kopf.PRESENT}
#: Pod events within this window are coalesced into one sweep per namespace.
SWEEP_DELAY_S = 0.5
REASON = "Unprotected"
#: Status writes that lost to a newer version in a row before a sweep gives
#: up (its Coalescer retries it).
WRITE_ATTEMPTS = 3


@dataclass(frozen=True)
class BarePod:
    name: str
    uid: str
    labels: dict[str, str]
    #: (apiVersion, kind, name, uid) of its controller (policy/identity.py), if any.
    owner: tuple[str, str, str, str | None] | None = None
    #: The policy an injected pod was injected for (None: a bare pod).
    policy: str | None = None


@kopf.index("v1", "pods", labels=OPTED_IN, annotations=NOT_INJECTED)
def unprotected_index(namespace: str, name: str, body: kopf.Body, meta: kopf.Meta,
                      status: kopf.Status, **_: Any) -> dict[str, BarePod]:
    """Opted-in, live pods without injection, by namespace. Empty, never
    None, for a pod that left that state: Kopf keeps an object's previous
    entry when its indexer returns None, so a finished pod would stay flagged
    (and counted, and alerted on) until deleted."""
    if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return {}  # it no longer needs protecting
    if injection.is_injected(dict(body)):
        return {}
    return {namespace: BarePod(name=name, uid=meta.get("uid", ""),
                               labels=dict(meta.get("labels") or {}),
                               owner=identity.controller_of(dict(body)))}


@kopf.index("v1", "pods", labels=OPTED_IN, annotations=INJECTED)
def injected_pods_index(namespace: str, name: str, body: kopf.Body, meta: kopf.Meta,
                        status: kopf.Status, **_: Any) -> dict[str, BarePod]:
    """Opted-in, live, injected pods by namespace, with the policy each was
    injected for: one whose policy was deleted is flagged as unselected."""
    policy = (meta.get("annotations") or {}).get(api.ANNOTATION_POLICY)
    if (meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed")
            or not policy):
        return {}  # empty, never None (see unprotected_index)
    return {namespace: BarePod(name=name, uid=meta.get("uid", ""), labels={},
                               owner=identity.controller_of(dict(body)), policy=policy)}


@kopf.on.event("v1", "pods", labels=OPTED_IN, annotations=NOT_INJECTED)
def pod_unprotected_event(namespace: str, memo: kopf.Memo, logger: logging.Logger,
                          unprotected_index: kopf.Index[str, BarePod],
                          checkpointpolicy_index: kopf.Index[Any, Any],
                          injected_pods_index: kopf.Index[str, BarePod], **_: Any) -> None:
    """A bare pod came, changed or went: sweep its namespace soon (also to clear)."""
    _start_periodic(memo.config, unprotected_index, checkpointpolicy_index, logger,
                    injected_pods_index)
    _schedule(namespace, unprotected_index, checkpointpolicy_index, logger,
              injected_pods_index, memo.config.watchdog_s)


@kopf.on.event(*POLICIES)
def policy_swept_event(type: str | None, namespace: str, memo: kopf.Memo,
                       logger: logging.Logger, unprotected_index: kopf.Index[str, BarePod],
                       checkpointpolicy_index: kopf.Index[Any, Any],
                       injected_pods_index: kopf.Index[str, BarePod], **_: Any) -> None:
    """A policy came or went: its namespace's injected pods may have lost
    their policy, or found it again."""
    _start_periodic(memo.config, unprotected_index, checkpointpolicy_index, logger,
                    injected_pods_index)
    if type in ("ADDED", "DELETED"):
        _schedule(namespace, unprotected_index, checkpointpolicy_index, logger,
                  injected_pods_index, memo.config.watchdog_s)


# -- the sweep ----------------------------------------------------------------

_warned: set[str] = set()  # pod uids with an Event posted; pruned to live ones
_gauged: set[tuple[str, str]] = set()  # (namespace, policy) with a gauge value
_unselected_gauged: set[str] = set()  # namespaces with an unselected-pods gauge value
#: (namespace, policy) → when a sweep first found injected pods of it missing.
_missing_since: dict[tuple[str, str], float] = {}
_clock = time.monotonic
#: How long a policy must be missing before its injected pods are flagged
#: (the operator passes CKPTDRAIN_WATCHDOG_PERIOD; this is its default).
ORPHAN_GRACE_S = 30.0
_lock = threading.Lock()


def sweep_namespace(namespace: str, pods_index: kopf.Index[str, BarePod],
                    policies: kopf.Index[Any, Any], logger: logging.Logger,
                    injected: kopf.Index[str, BarePod] | None = None,
                    orphan_grace_s: float = ORPHAN_GRACE_S) -> dict[str, int]:
    """Flag the bare pods of one namespace, those no policy selects too, and
    the injected pods whose policy is gone (for `orphan_grace_s`); returns
    {policy: count of its bare pods}."""
    bare = [p for p in list(pods_index.get(namespace, [])) if p is not None]
    bodies = [b for key in list(policies) if key[0] == namespace
              for b in policies.get(key, []) if b]
    now = datetime.now(UTC)
    counts: dict[str, int] = {}
    with _lock:
        for body in bodies:
            meta = body["metadata"]
            selector = (body.get("spec") or {}).get("selector") or {}
            chosen = [p for p in bare if pol.selector_matches(selector, p.labels)]
            counts[meta["name"]] = len(chosen)
            metrics.UNPROTECTED_PODS.labels(namespace, meta["name"]).set(len(chosen))
            _gauged.add((namespace, meta["name"]))
            try:
                _report_unprotected(namespace, body, chosen, now, logger)
            except (kube.ApiException, kube.HTTPError, OSError, RuntimeError) as error:
                # One policy's failed write stops neither the other policies
                # nor the unselected pods below; the next pass retries it.
                logger.warning("reporting the unprotected pods of policy %s/%s failed (%s)",
                               namespace, meta["name"], error)
        for ns, name in [k for k in _gauged if k[0] == namespace and k[1] not in counts]:
            metrics.UNPROTECTED_PODS.remove(ns, name)  # the policy is gone
            _gauged.discard((ns, name))
        selectors = [(b.get("spec") or {}).get("selector") or {} for b in bodies]
        lost = [p for p in bare if unselected.selected_by_none(p.labels, selectors)]
        lost += orphans(namespace, injected or {}, {b["metadata"]["name"] for b in bodies},
                        orphan_grace_s)
        _gauge_unselected(namespace, len(lost))
        live = {p.uid for key in list(pods_index) for p in pods_index.get(key, []) if p}
        _warned.intersection_update(live)
    # Outside the lock: thousands of Events must not hold up other namespaces.
    notices = unselected.notices(namespace, lost)
    unselected_events.keep_only(namespace, {n.uid for n in notices})
    unselected_events.post(namespace, notices, logger)
    return counts


def _report_unprotected(namespace: str, body: dict[str, Any], chosen: list[BarePod],
                        now: datetime, logger: logging.Logger) -> None:
    """Called with _lock held: the policy's PodsUnprotected condition and one
    Event per pod (a pod whose post failed is retried by the next pass)."""
    meta = body["metadata"]
    names = [p.name for p in chosen]
    # At the resourceVersion read, recomputed on a conflict: a merge patch
    # replaces the whole conditions list, so a write from an older read would
    # drop a condition another writer set meanwhile (the sizing's Ready).
    generation = meta.get("generation")

    def change_of(current: dict[str, Any]) -> dict[str, Any] | None:
        if (current.get("metadata") or {}).get("generation") != generation:
            return None  # chosen under another selector: the next pass's
        return st.with_unprotected(current.get("status") or {}, names, generation, now)

    kube.write_status_from(api.POLICIES, namespace, body, change_of, WRITE_ATTEMPTS)
    for p in chosen:
        if p.uid not in _warned:
            _warn(namespace, p, meta["name"])
            _warned.add(p.uid)
            logger.warning("pod %s/%s runs without injection (policy %s)",
                           namespace, p.name, meta["name"])


def orphans(namespace: str, injected: kopf.Index[str, BarePod], names: set[str],
            grace_s: float) -> list[BarePod]:
    """Called with _lock held: the live injected pods of `namespace` whose
    policy is not among `names` and has been missing for `grace_s` (since a
    sweep first found it missing): one deleted and created again is back
    before then, and its pods are never flagged."""
    now = _clock()
    lost = [p for p in list(injected.get(namespace, [])) if p and p.policy not in names]
    missing = {p.policy or "" for p in lost}
    for key in [k for k in _missing_since if k[0] == namespace and k[1] not in missing]:
        del _missing_since[key]  # back, or none of its pods left
    for name in missing:
        _missing_since.setdefault((namespace, name), now)
    return [p for p in lost if now - _missing_since[(namespace, p.policy or "")] >= grace_s]


def _orphaned_namespaces(injected: kopf.Index[str, BarePod],
                         policies: kopf.Index[Any, Any]) -> set[str]:
    held = {key[:2] for key in list(policies) if policies.get(key)}
    return {ns for ns in list(injected)
            for p in list(injected.get(ns, [])) if p and (ns, p.policy) not in held}


def _gauge_unselected(namespace: str, count: int) -> None:
    """Called with _lock held. No series for a namespace with none left: the
    periodic sweep then stops visiting it."""
    if count:
        metrics.UNSELECTED_PODS.labels(namespace).set(count)
        _unselected_gauged.add(namespace)
    elif namespace in _unselected_gauged:
        metrics.UNSELECTED_PODS.remove(namespace)
        _unselected_gauged.discard(namespace)


def drop_gauges() -> None:
    """This replica no longer reconciles: what it last saw is not news."""
    with _lock:
        for namespace, policy in _gauged:
            metrics.UNPROTECTED_PODS.remove(namespace, policy)
        for namespace in _unselected_gauged:
            metrics.UNSELECTED_PODS.remove(namespace)
        _gauged.clear()
        _unselected_gauged.clear()
        _missing_since.clear()
    unselected_events.forget()


def _warn(namespace: str, pod: BarePod, policy: str) -> None:
    body = {"metadata": {"name": pod.name, "namespace": namespace, "uid": pod.uid}}
    kube.post_event(body, "Pod", REASON,
                    f"labelled {api.LABEL_INJECT}=true and selected by CheckpointPolicy "
                    f"{policy}, but admitted without injection: it starts without restore "
                    "and is never drained. Delete the pod; its controller recreates it "
                    "through admission.", api_version="v1")


# -- when it runs ----------------------------------------------------------------

_passes = Coalescer("sweeping for unprotected pods")
_periodic_started = threading.Event()


def _schedule(namespace: str, pods_index: kopf.Index[str, BarePod],
              policies: kopf.Index[Any, Any], logger: logging.Logger,
              injected: kopf.Index[str, BarePod] | None, orphan_grace_s: float) -> None:
    _passes.schedule(namespace,
                     lambda: _sweep_logged(namespace, pods_index, policies, logger, injected,
                                           orphan_grace_s),
                     logger, SWEEP_DELAY_S)


def _sweep_logged(namespace: str, pods_index: kopf.Index[str, BarePod],
                  policies: kopf.Index[Any, Any], logger: logging.Logger,
                  injected: kopf.Index[str, BarePod] | None = None,
                  orphan_grace_s: float = ORPHAN_GRACE_S) -> None:
    try:
        sweep_namespace(namespace, pods_index, policies, logger, injected, orphan_grace_s)
    except (kube.ApiException, kube.HTTPError, OSError, RuntimeError) as error:
        # RuntimeError: an index changed while we read it; the next pass retries.
        logger.warning("sweeping %s for unprotected pods failed (%s)", namespace, error)


def _start_periodic(cfg: OperatorConfig, pods_index: kopf.Index[str, BarePod],
                    policies: kopf.Index[Any, Any], logger: logging.Logger,
                    injected: kopf.Index[str, BarePod] | None = None) -> None:
    """Once per process: every watchdog period, sweep every namespace that has
    bare pods, flagged policies, unselected pods or injected pods whose
    policy is gone (so that a policy created or deleted later, or a pod that
    left while we were standby, is seen too)."""
    if _periodic_started.is_set():
        return
    _periodic_started.set()

    def loop() -> None:
        while True:
            time.sleep(cfg.watchdog_s)
            try:
                _periodic_pass(pods_index, policies, logger, injected, cfg.watchdog_s)
            except Exception:  # the loop is all there is: it must go on
                logger.exception("the periodic sweep for unprotected pods failed; "
                                 "it runs again in %.0f s", cfg.watchdog_s)

    threading.Thread(target=loop, name="ckptdrain-sweep", daemon=True).start()


def _periodic_pass(pods_index: kopf.Index[str, BarePod], policies: kopf.Index[Any, Any],
                   logger: logging.Logger,
                   injected: kopf.Index[str, BarePod] | None = None,
                   orphan_grace_s: float = ORPHAN_GRACE_S) -> None:
    if not leadership.active():
        drop_gauges()
        return
    with _lock:
        flagged = {ns for ns, _ in _gauged} | _unselected_gauged
    try:
        namespaces = (set(pods_index) | flagged
                      | _orphaned_namespaces(injected or {}, policies))
    except RuntimeError:  # the index changed while we read it: next period
        return
    for namespace in sorted(namespaces):
        _sweep_logged(namespace, pods_index, policies, logger, injected, orphan_grace_s)
