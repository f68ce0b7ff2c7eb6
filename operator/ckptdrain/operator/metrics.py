"""Prometheus metrics of the operator (served on CKPTDRAIN_METRICS_PORT).

Per policy, what an alert needs (docs/alerts.md): its conditions as gauges
(`ckptdrain_policy_condition{type,status}`, one series per status, 1 for the
current one, the kube-state-metrics shape), when it was created, unprotected
pods, pods whose restore init container failed, and restores by tier. Labels
are namespace, policy and fixed sets: never a pod, a step or an error text.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from ckptdrain.contract import api

RECONCILES = Counter("ckptdrain_reconciles_total", "Reconciles by kind and outcome",
                     ["kind", "outcome"])
RECONCILE_SECONDS = Histogram("ckptdrain_reconcile_seconds", "Reconcile latency", ["kind"])
#: Up to the longest the apiserver waits for a webhook (30 s, `timeoutSeconds`'s
#: maximum and the conversion webhook's fixed limit): a review near its
#: timeout is the one to see, not a count in +Inf.
WEBHOOK_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)
WEBHOOK_SECONDS = Histogram("ckptdrain_webhook_seconds",
                            "Latency of admission and conversion reviews",
                            ["webhook", "outcome"], buckets=WEBHOOK_BUCKETS)
ALLOCATION_CHANGES = Counter("ckptdrain_allocation_changes_total",
                             "Pod bandwidth shares rewritten", ["namespace", "policy"])
RETENTION_EXPIRED = Counter("ckptdrain_checkpoints_expired_total",
                            "Checkpoint records expired by retention", ["namespace", "policy"])
UNPROTECTED_PODS = Gauge("ckptdrain_unprotected_pods",
                         "Selected pods running without injection (no restore, never "
                         "drained); delete them to recreate them through admission",
                         ["namespace", "policy"])
UNSELECTED_PODS = Gauge("ckptdrain_unselected_pods",
                        "Opted-in pods no CheckpointPolicy selects, running without "
                        "injection (no restore, never drained), and injected pods whose "
                        "CheckpointPolicy was deleted", ["namespace"])

POLICY_CONDITION = Gauge("ckptdrain_policy_condition",
                         "1 for each policy condition's current status (True, False, Unknown),"
                         " 0 for the other two", ["namespace", "policy", "type", "status"])
POLICY_CREATED = Gauge("ckptdrain_policy_created_timestamp_seconds",
                       "When the policy was created (Unix)", ["namespace", "policy"])
RESTORES = Counter("ckptdrain_restores_total",
                   "Pods that started after a restore, by the tier it read (fresh: nothing"
                   " was restored)", ["namespace", "policy", "tier"])
RESTORE_FAILING = Gauge("ckptdrain_restore_failing_pods",
                        "Pods whose restore init container last exited with an error",
                        ["namespace", "policy"])
NODE_LOSS_STEP = Gauge("ckptdrain_recovery_point_on_node_loss_step",
                       "With the peer tier on: the newest step the job can restore whichever "
                       "single node is lost (absent when no step survives every node loss)",
                       ["namespace", "policy"])
CONDITION_STATUSES = ("True", "False", "Unknown")
RESTORE_TIERS = ("local", "peer", "global", "fresh")
#: The restore init container's name (operator/admission/injection.py RESTORE).
RESTORE_CONTAINER = "ckptdrain-restore"

_lock = threading.Lock()
_conditions: dict[tuple[str, str], set[str]] = {}  # policy -> condition types with series
_failing: dict[str, tuple[str, str]] = {}  # pod uid -> its policy, while restore fails


def observe_policy(namespace: str, name: str, body: Mapping[str, Any], deleted: bool) -> None:
    """Mirror a policy's conditions and creation time; drop its series when it is gone."""
    key = (namespace, name)
    with _lock:
        before = _conditions.pop(key, set())
        now: set[str] = set()
        if not deleted:
            for cond in (body.get("status") or {}).get("conditions") or []:
                kind, status = cond.get("type"), cond.get("status")
                if not isinstance(kind, str) or not kind:
                    continue
                now.add(kind)
                for value in CONDITION_STATUSES:
                    POLICY_CONDITION.labels(namespace, name, kind, value).set(
                        1 if status == value else 0)
            created = (body.get("metadata") or {}).get("creationTimestamp")
            # Always stamped by the apiserver; anything else is skipped, not fatal.
            with contextlib.suppress(TypeError, ValueError):
                stamp = api.parse_timestamp(created).timestamp()
                POLICY_CREATED.labels(namespace, name).set(stamp)
            _conditions[key] = now
        for kind in before - now:
            for value in CONDITION_STATUSES:
                POLICY_CONDITION.remove(namespace, name, kind, value)
        if deleted:
            _remove(POLICY_CREATED, namespace, name)
            _remove(RESTORE_FAILING, namespace, name)
            _remove(NODE_LOSS_STEP, namespace, name)
            for tier in RESTORE_TIERS:
                _remove(RESTORES, namespace, name, tier)


def _remove(metric: Gauge | Counter, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never set
        metric.remove(*labels)


def observe_node_loss(namespace: str, policy: str, step: int | None) -> None:
    """The recovery point on node loss; no series while there is none (a step
    number of 0 would read as a real, very old checkpoint)."""
    if step is None:
        _remove(NODE_LOSS_STEP, namespace, policy)
    else:
        NODE_LOSS_STEP.labels(namespace, policy).set(step)


def restore_tier(source: str) -> str:
    """The tier in a `ckptdrain.io/restored-from` value (`step=N tier=T` or `fresh`)."""
    for part in source.split():
        if part.startswith("tier=") and part[5:] in RESTORE_TIERS:
            return part[5:]
    return "fresh"


def observe_restored(namespace: str, policy: str, source: str) -> None:
    """A pod started from `source` (counted once per pod by the caller)."""
    RESTORES.labels(namespace, policy, restore_tier(source)).inc()


def restore_failed(pod_status: Mapping[str, Any]) -> bool:
    """True when the pod's restore init container's last run exited non-zero
    (it is failed now, or waiting to be run again after failing)."""
    for status in pod_status.get("initContainerStatuses") or []:
        if status.get("name") != RESTORE_CONTAINER:
            continue
        state = status.get("state") or {}
        if "terminated" in state:
            return (state["terminated"] or {}).get("exitCode", 0) != 0
        if "waiting" in state:
            last = (status.get("lastState") or {}).get("terminated") or {}
            return last.get("exitCode", 0) != 0
        return False  # running: the outcome is not known yet
    return False


def observe_pod_restore(namespace: str, policy: str, uid: str,
                        pod_status: Mapping[str, Any], deleted: bool) -> None:
    """Keep `ckptdrain_restore_failing_pods` in step with one injected pod."""
    with _lock:
        was = _failing.pop(uid, None)
        if not deleted and policy and restore_failed(pod_status):
            _failing[uid] = (namespace, policy)
        for key in {was, _failing.get(uid)} - {None}:
            assert key is not None
            RESTORE_FAILING.labels(*key).set(sum(1 for k in _failing.values() if k == key))


@contextmanager
def reconciling(kind: str) -> Iterator[None]:
    """Count and time one reconcile; an exception counts as an error and propagates."""
    start = time.perf_counter()
    try:
        yield
    except Exception:
        RECONCILES.labels(kind, "error").inc()
        raise
    else:
        RECONCILES.labels(kind, "ok").inc()
    finally:
        RECONCILE_SECONDS.labels(kind).observe(time.perf_counter() - start)


@contextmanager
def admitting(webhook: str) -> Iterator[None]:
    start = time.perf_counter()
    outcome = "error"
    try:
        yield
        outcome = "ok"
    finally:
        WEBHOOK_SECONDS.labels(webhook, outcome).observe(time.perf_counter() - start)
