"""Kopf wiring: thin handlers named `<kind>_<event>`. They read, call the
pure core (policy, status, allocation, records) and write.

State lives in the cluster: in-memory indexes are rebuilt from the watches on
every start, shares and record names are deterministic, so a restarted
operator converges to the same result without duplicates.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import kopf

from ckptdrain.contract import api
from ckptdrain.contract.progress import ANNOTATION_PROGRESS
from ckptdrain.contract.record import record_name
from ckptdrain.operator import heap, metrics
from ckptdrain.operator.admission import supervisor as admission_supervisor
from ckptdrain.operator.admission import webhook
from ckptdrain.operator.apiserver import class_view, diffbase, leadership, policy_edge, slim
from ckptdrain.operator.bandwidth import rebalance, share_channel
from ckptdrain.operator.coalesce import Coalescer
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.goodput import sync as goodput_sync
from ckptdrain.operator.kueue import report as kueue_report
from ckptdrain.operator.migration import run as storage_migration
from ckptdrain.operator.peers import sync as peer_sync
from ckptdrain.operator.policy import allocation, version_messages
from ckptdrain.operator.policy_reconcile import reconcile_policy, schedule_peers
from ckptdrain.operator.records import restores
from ckptdrain.operator.records import sync as record_sync

PREFIX = api.GROUP
#: At v1beta1, the storage version; each body seen at v1alpha1 (policy_edge.py).
POLICIES = policy_edge.RESOURCE
CHECKPOINTS = (api.GROUP, api.VERSION, api.CHECKPOINTS)
INJECTED = {api.ANNOTATION_INJECTED: kopf.PRESENT}
#: Pod events within this window are coalesced into one rebalance per policy,
#: so a burst of N pods costs a few passes over N pods, not N passes.
RETRY_DELAY_S = 5.0
#: Seconds an object's idle Kopf worker waits for its next event.
IDLE_WORKER_S = 0.2
Key = tuple[str, str]

#: A record's aggregate and its policy's retention and recovery point: one
#: pass per burst of claims, not one per claim (thousands per checkpoint).
_record_passes = Coalescer("summarising checkpoint records", RETRY_DELAY_S)
RECORD_DELAY_S = 0.5
#: Goodput into the policy status: one fold per policy per burst (goodput/sync.py).
_goodput_passes = Coalescer("folding goodput", RETRY_DELAY_S)


def _now() -> datetime:
    return datetime.now(UTC)


_values = rebalance.values


@kopf.on.startup()
def operator_startup(settings: kopf.OperatorSettings, memo: kopf.Memo,
                     logger: logging.Logger, **_: Any) -> None:
    """Our own prefixes, Kopf's bookkeeping in annotations, webhooks, peering."""
    cfg: OperatorConfig = memo.config
    settings.persistence.finalizer = f"{PREFIX}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = diffbase.PodlessDiffBase(
        prefix=PREFIX, key="last-handled-configuration")
    settings.peering.name = cfg.peering
    settings.peering.mandatory = False  # without Kopf's peering CRDs: run, and warn
    settings.peering.clusterwide = not cfg.namespace
    # Equal priorities pause every replica; a random one lets exactly one work.
    settings.peering.priority = leadership.PRIORITY
    # Pods reach us by a server-side label selector: only opted-in pods are
    # listed and watched, never every pod of the cluster.
    settings.watching.label_selectors["v1", "pods"] = f"{api.LABEL_INJECT}=true"
    leadership.start(cfg.peering, cfg.namespace or None, settings.peering.standalone, logger)
    class_view.start(logger)  # the CheckpointClasses every policy is parsed under
    kueue_report.start(cfg)  # conflicts with Kueue, at the end of each recency pass
    # Objects stored before the CRD's storage flip, rewritten by the leader.
    storage_migration.start(cfg.namespace, cfg.storage_check_s, cfg.storage_settle_s)
    settings.posting.level = logging.INFO
    # Re-establish watches every few minutes, so a silently stalled one heals.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 30
    settings.execution.max_workers = 8
    # An object's worker holds its last event while it idles for the next
    # one: not 5 s (Kopf's default) but a moment, so a checkpoint's burst
    # does not keep every writer's pod object alive for that long. No limit
    # on the workers (settings.queueing.worker_limit): until the operator has
    # indexed every object, each worker waits for all the others, so a limit
    # below the number of objects present at a restart would never start.
    settings.queueing.idle_timeout = IDLE_WORKER_S
    if cfg.webhook_port:
        files = webhook.certificate_files(cfg, logger)
        settings.admission.server = (admission_supervisor.start(cfg, files, logger)
                                     if cfg.webhook_process else
                                     webhook.build_server(cfg, files))
        settings.admission.managed = cfg.webhook_managed or None


# -- indexes: what the handlers and the webhook look up without API calls ----


@kopf.index(*POLICIES)
def checkpointpolicy_index(namespace: str, name: str, body: kopf.Body,
                           **_: Any) -> dict[Key, dict[str, Any]]:
    # Without the field manager's bookkeeping, but for the version each field
    # was written at: a reconcile from here (class_events.py) says problems
    # in it.
    seen = policy_edge.seen(body)
    return {(namespace, name): version_messages.kept_versions(slim.kept_copy(seen), seen)}


@kopf.index("v1", "pods", annotations=INJECTED)
def pod_index(namespace: str, name: str, meta: kopf.Meta, status: kopf.Status, spec: kopf.Spec,
              **_: Any) -> dict[Key, allocation.DrainingPod]:
    if status.get("phase") in ("Succeeded", "Failed") or api.is_reader(meta.get("labels")):
        # A finished pod drains nothing more, and a reader never does. Empty,
        # not None: Kopf keeps an object's previous entry when its indexer
        # returns None, so a Job's completed pods would count as drainers
        # until deleted. A pod in its grace period still counts: it is
        # flushing its emergency checkpoint.
        return {}
    ann = meta.get("annotations", {})
    counted = allocation.parse_annotation_number(ann.get(api.ANNOTATION_WORKLOAD_WRITERS))
    return {(namespace, ann.get(api.ANNOTATION_POLICY, "")): allocation.DrainingPod(
        pod=name, pending_bytes=allocation.parse_annotation_number(
            ann.get(api.ANNOTATION_PENDING)),
        created=meta.get("creationTimestamp"),
        writer=(meta.get("labels") or {}).get(api.LABEL_WRITER),
        workload_writers=None if counted is None else int(counted),
        deleting=meta.get("deletionTimestamp") is not None,
        follows_scale=ann.get(api.ANNOTATION_SHARE_SCALE) == "true",
        node_selector=tuple(sorted((str(k), str(v)) for k, v in
                                   (spec.get("nodeSelector") or {}).items())))}


@kopf.index(*CHECKPOINTS)
def checkpoint_index(namespace: str, spec: kopf.Spec, body: kopf.Body,
                     **_: Any) -> dict[Key, dict[str, Any]]:
    return {(namespace, spec.get("policy", "")): slim.kept_copy(body)}


@kopf.index("v1", "pods", annotations=INJECTED)
def progress_index(namespace: str, name: str, meta: kopf.Meta, spec: kopf.Spec,
                   **_: Any) -> dict[Key, record_sync.WriterProgress]:
    """Each writer's progress as its pod last said it (finished pods too: a
    pod that completed after its last drain still vouches for it). A reader
    vouches for nothing."""
    if api.is_reader(meta.get("labels")):
        return {}
    ann = meta.get("annotations", {})
    key = (namespace, ann.get(api.ANNOTATION_POLICY, ""))
    found = record_sync.progress_of(name, spec.get("nodeName"),
                                    ann.get(ANNOTATION_PROGRESS), meta.get("uid", ""),
                                    (meta.get("labels") or {}).get(api.LABEL_WRITER),
                                    meta.get("creationTimestamp"))
    return {} if found is None else {key: found}


# -- policies -----------------------------------------------------------------


@kopf.on.create(*POLICIES, timeout=300, backoff=10)
def checkpointpolicy_create(**kwargs: Any) -> None:
    reconcile_policy(announce=True, **_pick(kwargs))


@kopf.on.update(*POLICIES, field="spec", timeout=300, backoff=10)
def checkpointpolicy_update(**kwargs: Any) -> None:
    reconcile_policy(announce=True, **_pick(kwargs))


@kopf.on.resume(*POLICIES, timeout=300, backoff=10)
def checkpointpolicy_resume(**kwargs: Any) -> None:
    reconcile_policy(announce=False, **_pick(kwargs))


@kopf.on.event(*POLICIES)
def checkpointpolicy_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo,
                           logger: logging.Logger,
                           pod_index: kopf.Index[Key, Any],
                           checkpointpolicy_index: kopf.Index[Key, Any], **_: Any) -> None:
    """Conditions to the metrics; a policy gone frees its part of the cluster cap."""
    body = kopf.Body(policy_edge.seen(body))
    key = (body.metadata.namespace or "", body.metadata.name or "")
    if event.get("type") != "DELETED":
        # First: Kopf runs this after its indexes hold the object (bandwidth/rebalance.py).
        rebalance.changes.seen(key, body)
    metrics.observe_policy(body.metadata.namespace or "", body.metadata.name or "", body,
                           deleted=event.get("type") == "DELETED")
    if event.get("type") != "DELETED" and rebalance.stale(key, body):
        # A budget or constraint the joint allocation no longer holds (a late, stale patch).
        rebalance.schedule(rebalance.JOINT, memo.config, checkpointpolicy_index, pod_index,
                           logger)
    if event.get("type") == "DELETED":
        rebalance.forget(key)
        restores.forget(key)
        share_channel.forget(key)
        rebalance.schedule(rebalance.JOINT, memo.config, checkpointpolicy_index, pod_index, logger)
        meta = (event.get("object") or {}).get("metadata") or {}
        goodput_sync.forget((meta.get("namespace", ""), meta.get("name", "")))
        peer_sync.forget((meta.get("namespace", ""), meta.get("name", "")), meta.get("uid"),
                         memo.config.peer_ca_namespace)


def _pick(kwargs: dict[str, Any]) -> dict[str, Any]:
    names = ("memo", "logger", "pod_index", "checkpointpolicy_index",
             "checkpoint_index", "peer_pod_index", "progress_index")
    return {"body": kopf.Body(policy_edge.seen(kwargs["body"])), **{k: kwargs[k] for k in names}}


# -- pods: bandwidth shares, goodput, restores (records/restores.py) -------------------


@kopf.on.event("v1", "pods", annotations=INJECTED)
def pod_event(event: kopf.RawEvent, body: kopf.Body, meta: kopf.Meta, namespace: str,
              memo: kopf.Memo, logger: logging.Logger, pod_index: kopf.Index[Key, Any],
              checkpointpolicy_index: kopf.Index[Key, Any],
              goodput_index: kopf.Index[Key, Any], peer_pod_index: kopf.Index[Key, Any],
              checkpoint_index: kopf.Index[Key, Any], progress_index: kopf.Index[Key, Any],
              **_: Any) -> None:
    heap.busy()  # no heap trim in the middle of a burst
    annotations = meta.get("annotations", {})
    key = (namespace, annotations.get(api.ANNOTATION_POLICY, ""))
    rebalance.schedule(key, memo.config, checkpointpolicy_index, pod_index, logger)
    deleted = event.get("type") == "DELETED"
    text = annotations.get(ANNOTATION_PROGRESS)
    if deleted:  # its last word may not be folded yet: kept a while
        steps = record_sync.depart(key, meta.get("uid", ""), record_sync.progress_of(
            meta.get("name", ""), (body.get("spec") or {}).get("nodeName"), text,
            meta.get("uid", ""), (meta.get("labels") or {}).get(api.LABEL_WRITER),
            meta.get("creationTimestamp")), time.monotonic())
    else:
        steps = record_sync.changed_steps(meta.get("uid", ""), text, False)
    for step in steps:
        _schedule_record_pass(key, step, memo, logger, checkpoint_index,
                              checkpointpolicy_index, peer_pod_index, progress_index)
    if not steps:  # a record pass schedules the peer tier's after it
        schedule_peers(key, memo.config, checkpointpolicy_index, peer_pod_index,
                        checkpoint_index, logger, progress_index)
    policy_there = bool(_values(checkpointpolicy_index, key))
    if goodput_sync.observe(key, meta.get("name", ""), meta, deleted=deleted,
                            has_policy=policy_there, status=body.get("status")):
        _schedule_goodput(key, logger, checkpointpolicy_index, goodput_index)
    uid = meta.get("uid", "")
    metrics.observe_pod_restore(namespace, key[1], uid, body.get("status") or {},
                                deleted=deleted)
    source = annotations.get(api.ANNOTATION_RESTORED)
    if restores.observe(key, uid, meta.get("name", ""), source, deleted,
                        api.timestamp(_now())):
        kopf.info(body, reason="Restored", message=f"started from {source} ({key[1]})")
        restores.schedule(key, lambda: next(iter(_values(checkpointpolicy_index, key)), None),
                          logger)


def _schedule_goodput(key: Key, logger: logging.Logger, policies: kopf.Index[Key, Any],
                      views: kopf.Index[Key, Any]) -> None:
    """One goodput fold per policy for a burst of pod events (goodput/sync.py)."""
    _goodput_passes.schedule(key, lambda: goodput_sync.fold(
        key, next(iter(_values(policies, key)), None), _values(views, key)),
        logger, RECORD_DELAY_S)



# -- checkpoint records: completion, retention, recovery point ------------------


@kopf.on.event(*CHECKPOINTS)
def checkpoint_event(event: kopf.RawEvent, namespace: str, spec: kopf.Spec,
                     memo: kopf.Memo, logger: logging.Logger,
                     checkpoint_index: kopf.Index[Key, Any],
                     checkpointpolicy_index: kopf.Index[Key, Any],
                     peer_pod_index: kopf.Index[Key, Any],
                     progress_index: kopf.Index[Key, Any], **_: Any) -> None:
    """A record changed (our fold, a sweep, an older agent's claim) or went:
    one pass over it and its policy for the burst."""
    key = (namespace, spec.get("policy", ""))
    step = spec.get("step")
    if event.get("type") == "DELETED" or type(step) is not int:
        step = None
    _schedule_record_pass(key, step, memo, logger, checkpoint_index, checkpointpolicy_index,
                          peer_pod_index, progress_index)


def _schedule_record_pass(key: Key, step: int | None, memo: kopf.Memo,
                          logger: logging.Logger, checkpoints: kopf.Index[Key, Any],
                          policies: kopf.Index[Key, Any], peer_pods: kopf.Index[Key, Any],
                          progress: kopf.Index[Key, Any]) -> None:
    """One pass per record (the step's) and one per policy (None: a sweep):
    the writers' progress folded in, then retention and the recovery point."""
    record = None if step is None else record_name(key[1], step)

    def run() -> None:
        writers = record_sync.with_departed(key, _values(progress, key), time.monotonic())
        record_sync.summarise(key, record, step, writers, memo.config,
                              _values(checkpoints, key),
                              next(iter(_values(policies, key)), None), rebalance.locks[key],
                              logger)
        # The recovery point on node loss moves with the writers' claims.
        schedule_peers(key, memo.config, policies, peer_pods, checkpoints, logger, progress)

    _record_passes.schedule((key, record), run, logger, RECORD_DELAY_S)


# -- the peer tier: Secrets, the peers ConfigMap, status (peers/sync.py) ---------
