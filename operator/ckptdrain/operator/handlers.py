"""Kopf wiring: thin handlers named `<kind>_<event>`. They read, call the
pure core (policy, status, allocation, records) and write.

State lives in the cluster: in-memory indexes are rebuilt from the watches on
every start, shares and record names are deterministic, so a restarted
operator converges to the same result without duplicates.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from ckptdrain import sizing
from ckptdrain.contract import api
from ckptdrain.contract.progress import ANNOTATION_PROGRESS
from ckptdrain.contract.record import record_name
from ckptdrain.errors import InvalidInput
from ckptdrain.operator import (
    allocation,
    budgets,
    goodput_sync,
    heap,
    kube,
    leadership,
    metrics,
    peer_sync,
    record_sync,
    restores,
    share_channel,
    watchdog,
    webhook,
)
from ckptdrain.operator import policy as pol
from ckptdrain.operator import status as st
from ckptdrain.operator.coalesce import Coalescer
from ckptdrain.operator.config import OperatorConfig

PREFIX = api.GROUP
POLICIES = (api.GROUP, api.VERSION, api.POLICIES)
CHECKPOINTS = (api.GROUP, api.VERSION, api.CHECKPOINTS)
INJECTED = {api.ANNOTATION_INJECTED: kopf.PRESENT}
#: Pod events within this window are coalesced into one rebalance per policy,
#: so a burst of N pods costs a few passes over N pods, not N passes.
REBALANCE_DELAY_S = 0.5
RETRY_DELAY_S = 5.0
#: Seconds an object's idle Kopf worker waits for its next event.
IDLE_WORKER_S = 0.2
Key = tuple[str, str]
#: Not a policy (no policy is nameless): the one coalesced pass that
#: re-statuses and rebalances every policy whose joint budget moved.
JOINT: Key = ("", "")

_locks: defaultdict[Key, threading.Lock] = defaultdict(threading.Lock)
_rebalances = Coalescer("rebalancing", RETRY_DELAY_S)
#: A record's aggregate and its policy's retention and recovery point: one
#: pass per burst of claims, not one per claim (thousands per checkpoint).
_record_passes = Coalescer("summarising checkpoint records", RETRY_DELAY_S)
RECORD_DELAY_S = 0.5
#: Goodput into the policy status: one fold per policy per burst (goodput_sync.py).
_goodput_passes = Coalescer("folding goodput", RETRY_DELAY_S)
#: Each policy's sizing and cluster share as the last joint pass computed
#: them. A policy's own reconcile may patch a budget computed before every
#: policy was indexed, and another writer of the conditions may patch from an
#: index that had not yet seen the joint pass's patch; either can land after
#: the pass that corrected it. Its event then disagrees with this, and another
#: joint pass follows.
_joint_last: dict[Key, tuple[sizing.Sizing, allocation.ClusterShare]] = {}
#: One joint pass at a time: an older pass finishing after a newer one would
#: write its older budgets and leave `_joint_last` agreeing with them.
_joint_lock = threading.Lock()
#: Parsed policies and the last joint split, so a pass re-parses and re-sizes
#: only what changed (budgets.py).
_joint = budgets.JointBudgets()


class PodlessDiffBase(kopf.AnnotationsDiffBaseStorage):
    """Kopf's diff base, but none for pods. Kopf builds an object's essence
    (two deep copies of the whole object) on every event of every watched
    kind, to detect changes for create/update/resume handlers; pods have no
    such handlers here, only indexes and event handlers, and at a
    checkpoint's burst those copies were the largest part of the operator's
    work and of its memory peak (docs/scale.md, "Operator memory")."""

    def build(self, *, body: kopf.Body,
              extra_fields: Any = None) -> kopf.BodyEssence:
        if body.get("kind") == "Pod" and body.get("apiVersion") == "v1":
            return kopf.BodyEssence()
        return super().build(body=body, extra_fields=extra_fields)


def _now() -> datetime:
    return datetime.now(UTC)


def _values(index: kopf.Index[Key, Any], key: Key) -> list[Any]:
    return [v for v in index.get(key, []) if v is not None]


@kopf.on.startup()
def operator_startup(settings: kopf.OperatorSettings, memo: kopf.Memo,
                     logger: logging.Logger, **_: Any) -> None:
    """Our own prefixes, Kopf's bookkeeping in annotations, webhooks, peering."""
    cfg: OperatorConfig = memo.config
    settings.persistence.finalizer = f"{PREFIX}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = PodlessDiffBase(
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
        settings.admission.server = webhook.build_server(cfg, logger)
        settings.admission.managed = cfg.webhook_managed or None


# -- indexes: what the handlers and the webhook look up without API calls ----


@kopf.index(*POLICIES)
def checkpointpolicy_index(namespace: str, name: str, body: kopf.Body,
                           **_: Any) -> dict[Key, dict[str, Any]]:
    return {(namespace, name): copy.deepcopy(dict(body))}


@kopf.index("v1", "pods", annotations=INJECTED)
def pod_index(namespace: str, name: str, meta: kopf.Meta, status: kopf.Status,
              **_: Any) -> dict[Key, allocation.DrainingPod]:
    if status.get("phase") in ("Succeeded", "Failed"):
        # A finished pod drains nothing more. Empty, not None: Kopf keeps an
        # object's previous entry when its indexer returns None, so a Job's
        # completed pods would count as drainers until deleted. A pod in its
        # grace period still counts: it is flushing its emergency checkpoint.
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
        follows_scale=ann.get(api.ANNOTATION_SHARE_SCALE) == "true")}


@kopf.index(*CHECKPOINTS)
def checkpoint_index(namespace: str, spec: kopf.Spec, body: kopf.Body,
                     **_: Any) -> dict[Key, dict[str, Any]]:
    return {(namespace, spec.get("policy", "")): copy.deepcopy(dict(body))}


@kopf.index("v1", "pods", annotations=INJECTED)
def progress_index(namespace: str, name: str, meta: kopf.Meta, spec: kopf.Spec,
                   **_: Any) -> dict[Key, record_sync.WriterProgress]:
    """Each writer's progress as its pod last said it (finished pods too: a
    pod that completed after its last drain still vouches for it)."""
    ann = meta.get("annotations", {})
    key = (namespace, ann.get(api.ANNOTATION_POLICY, ""))
    found = record_sync.progress_of(name, spec.get("nodeName"),
                                    ann.get(ANNOTATION_PROGRESS), meta.get("uid", ""),
                                    (meta.get("labels") or {}).get(api.LABEL_WRITER),
                                    meta.get("creationTimestamp"))
    return {} if found is None else {key: found}


# -- policies -----------------------------------------------------------------


def _parse(cfg: OperatorConfig, body: dict[str, Any], drainers: int) -> pol.Policy:
    meta = body.get("metadata", {})
    return pol.parse(meta.get("namespace", ""), meta.get("name", ""), body.get("spec", {}),
                     cfg, drainers=max(1, drainers))


def _reconcile_policy(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo,
                      logger: logging.Logger, pod_index: kopf.Index[Key, Any],
                      checkpointpolicy_index: kopf.Index[Key, Any],
                      checkpoint_index: kopf.Index[Key, Any],
                      peer_pod_index: kopf.Index[Key, Any],
                      progress_index: kopf.Index[Key, Any], announce: bool) -> None:
    cfg: OperatorConfig = memo.config
    watchdog.start(cfg, checkpointpolicy_index, pod_index, checkpoint_index,
                   lambda: _budgets(cfg, checkpointpolicy_index, pod_index), logger)
    key = (body.metadata.namespace or "", body.metadata.name or "")
    drainers = len(_values(pod_index, key))
    generation = body.metadata.get("generation")
    previous = body.status.get("conditions", [])
    with metrics.reconciling("checkpointpolicy"):
        try:
            parsed = _parse(cfg, dict(body), drainers)
            sized = pol.compute_sizing(parsed)
        except InvalidInput as error:
            patch.status.update(st.for_invalid(str(error), generation, _now(), previous))
            kopf.warn(body, reason="InvalidSpec", message=str(error))
            _schedule_peers(key, cfg, checkpointpolicy_index, peer_pod_index,
                            checkpoint_index, logger, progress_index)
            return
        joint = _budgets(cfg, checkpointpolicy_index, pod_index, {key: parsed})
        cluster = None
        if key in joint:
            sized, cluster = joint[key][0], joint[key][1]
        new = st.for_sizing(sized, generation, _now(), previous, active_drainers=drainers,
                            cluster=cluster)
        new["drainers"] = drainers
        patch.status.update(new)
    if announce:
        kopf.info(body, reason="Sized", message=new["conditions"][0]["message"])
        if sized.bandwidth_constrained:
            kopf.warn(body, reason="BandwidthConstrained", message=new["conditions"][2]["message"])
    logger.info("sized: %s", new["conditions"][0]["message"])
    _schedule_rebalance(key, cfg, checkpointpolicy_index, pod_index, logger)
    _schedule_rebalance(JOINT, cfg, checkpointpolicy_index, pod_index, logger)
    _schedule_peers(key, cfg, checkpointpolicy_index, peer_pod_index, checkpoint_index,
                    logger, progress_index)


@kopf.on.create(*POLICIES, timeout=300, backoff=10)
def checkpointpolicy_create(**kwargs: Any) -> None:
    _reconcile_policy(announce=True, **_pick(kwargs))


@kopf.on.update(*POLICIES, field="spec", timeout=300, backoff=10)
def checkpointpolicy_update(**kwargs: Any) -> None:
    _reconcile_policy(announce=True, **_pick(kwargs))


@kopf.on.resume(*POLICIES, timeout=300, backoff=10)
def checkpointpolicy_resume(**kwargs: Any) -> None:
    _reconcile_policy(announce=False, **_pick(kwargs))


@kopf.on.event(*POLICIES)
def checkpointpolicy_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo,
                           logger: logging.Logger,
                           pod_index: kopf.Index[Key, Any],
                           checkpointpolicy_index: kopf.Index[Key, Any], **_: Any) -> None:
    """Conditions to the metrics; a policy gone frees its part of the cluster cap."""
    metrics.observe_policy(body.metadata.namespace or "", body.metadata.name or "", body,
                           deleted=event.get("type") == "DELETED")
    key = (body.metadata.namespace or "", body.metadata.name or "")
    last = _joint_last.get(key)
    if event.get("type") != "DELETED" and (body.get("status") or {}).get("conditions") \
            and last is not None and _disagrees(body, *last):
        # A budget or constraint the joint allocation no longer holds (a late, stale patch).
        _schedule_rebalance(JOINT, memo.config, checkpointpolicy_index, pod_index, logger)
    if event.get("type") == "DELETED":
        _joint_last.pop(key, None)
        _joint.forget(key)
        restores.forget(key)
        share_channel.forget(key)
        _schedule_rebalance(JOINT, memo.config, checkpointpolicy_index, pod_index, logger)
        meta = (event.get("object") or {}).get("metadata") or {}
        goodput_sync.forget((meta.get("namespace", ""), meta.get("name", "")))
        peer_sync.forget((meta.get("namespace", ""), meta.get("name", "")), meta.get("uid"))


def _pick(kwargs: dict[str, Any]) -> dict[str, Any]:
    names = ("body", "patch", "memo", "logger", "pod_index", "checkpointpolicy_index",
             "checkpoint_index", "peer_pod_index", "progress_index")
    return {k: kwargs[k] for k in names}


# -- pods: bandwidth shares, goodput, restores (restores.py) -------------------


def _budgets(cfg: OperatorConfig, policies: kopf.Index[Key, Any],
             pods: kopf.Index[Key, Any], fresh: dict[Key, pol.Policy] | None = None,
             ) -> dict[Key, budgets.Budget]:
    """Each valid policy's sizing under the joint budget (its own cap applied,
    then the cluster cap jointly); `fresh` overrides what the index holds."""
    bodies = {key: body for key in list(policies)
              for body in _values(policies, key)[:1]}
    return _joint.compute(bodies, {key: len(_values(pods, key)) for key in bodies},
                          cfg.cluster_bandwidth, lambda body, n: _parse(cfg, dict(body), n),
                          cfg, fresh)


def _rebalance_moved(cfg: OperatorConfig, policies: kopf.Index[Key, Any],
                     pods: kopf.Index[Key, Any], logger: logging.Logger) -> None:
    """Rebalance (and so re-status) every policy whose joint budget moved, from
    one joint allocation: a burst of policy changes costs one pass, not one per policy."""
    with _joint_lock:
        _rebalance_moved_locked(cfg, policies, pods, logger)


def _rebalance_moved_locked(cfg: OperatorConfig, policies: kopf.Index[Key, Any],
                            pods: kopf.Index[Key, Any], logger: logging.Logger) -> None:
    joint = _budgets(cfg, policies, pods)
    if joint and leadership.active():
        # One write per namespace tells every agent a smaller factor; the
        # channels are rewritten below where budgets grew or more than the
        # factor moved.
        _publish_scale("", joint, cfg, policies, pods, logger)
    before = {k: v[0].allowed_bandwidth for k, v in _joint_last.items()}
    # Budgets that shrink are published before those that grow, and a larger
    # factor between them, so the cluster's sum never passes the cap on the way.
    ordered = sorted(joint.items(), key=lambda kv: kv[1][0].allowed_bandwidth
                     - before.get(kv[0], 0.0))
    raised = False
    for key, (sized, cluster, _) in ordered:
        if not raised and sized.allowed_bandwidth > before.get(key, 0.0):
            raised = True
            if leadership.active():
                _publish_scale("", joint, cfg, policies, pods, logger, may_raise=True)
        _joint_last[key] = (sized, cluster)
        body = next(iter(_values(policies, key)), {})
        if _disagrees(body, sized, cluster):
            _rebalance(key, cfg, policies, pods, logger, joint)
    if not raised and joint and leadership.active():
        _publish_scale("", joint, cfg, policies, pods, logger, may_raise=True)


_scale_log = logging.getLogger("ckptdrain.operator.scale")


def _publish_scale(namespace: str, joint: Mapping[Key, budgets.Budget], cfg: OperatorConfig,
                   policies: kopf.Index[Key, Any], pods: kopf.Index[Key, Any],
                   logger: logging.Logger, may_raise: bool = False) -> bool:
    """The cluster scale to every namespace with a policy, where it moved;
    whether `namespace`'s holds it (share_channel.publish_scale)."""
    cluster = next(iter(joint.values()))[1]

    def fresh() -> tuple[set[str], float, float | None]:
        now = _budgets(cfg, policies, pods)
        if not now:
            return set(), 1.0, cfg.cluster_bandwidth
        share = next(iter(now.values()))[1]
        return {key[0] for key in now}, share.factor, share.cluster_cap

    return share_channel.publish_scale(namespace, cluster.factor, cluster.cluster_cap, fresh,
                                       may_raise=may_raise, active=leadership.active,
                                       log=_scale_log.warning)


def _disagrees(body: Mapping[str, Any], sized: sizing.Sizing,
               cluster: allocation.ClusterShare) -> bool:
    """The policy's status says another budget or constraint than the joint one."""
    status = body.get("status") or {}
    return status.get("allowedBandwidthBytes") != int(sized.allowed_bandwidth) or \
        st.with_cluster(status, sized, cluster, body.get("metadata", {}).get("generation"),
                        _now()) is not None


def _rebalance(key: Key, cfg: OperatorConfig, policies: kopf.Index[Key, Any],
               pods: kopf.Index[Key, Any], logger: logging.Logger,
               joint: dict[Key, budgets.Budget] | None = None) -> None:
    with _locks[key], metrics.reconciling("allocation"):
        joint = _budgets(cfg, policies, pods) if joint is None else joint
        mine = joint.get(key)
        if mine is None:
            return
        sized, cluster, policy = mine
        drainers = _values(pods, key)
        body = next(iter(_values(policies, key)), {})
        if not leadership.active():
            share_channel.forget()  # a standby's indexes are frozen: publish nothing
            return
        draining = [share_channel.Drainer(d.pod, share_channel.rank_of(d.writer))
                    for d in drainers if (d.pending_bytes or 0) > 0]
        # A smaller factor goes out first, everywhere; the channel then leaves
        # shrinks to it, unless the scale is not in place or an agent cannot read it.
        scaled = _publish_scale(key[0], joint, cfg, policies, pods, logger) \
            and all(d.follows_scale for d in drainers)
        written, recheck = share_channel.publish(
            key, sized.allowed_bandwidth, policy.per_drainer_cap, draining,
            max(policy.writers, len(drainers)), share_channel.owner_of(body),
            time.monotonic(), lambda: api.timestamp(_now()),
            wanted=cluster.wanted if scaled else None)
        if written:
            metrics.ALLOCATION_CHANGES.labels(*key).inc()
            logger.info("share channel %s/%s: %d of %d pods draining (budget %d B/s)",
                        *key, len(draining), len(drainers), int(sized.allowed_bandwidth))
        if recheck is not None:
            # A drainer waits to be admitted, or a heartbeat is due: come back.
            _schedule_rebalance(key, cfg, policies, pods, logger, max(recheck, 0.05))
        status = body.get("status") or {}
        change = st.with_cluster(status, sized, cluster,
                                 body.get("metadata", {}).get("generation"), _now()) or {}
        if status.get("phase") in ("Ready", "Constrained") \
                and status.get("drainers") != len(drainers):
            change["drainers"] = len(drainers)
        if change:
            kube.patch_status(api.POLICIES, key[0], key[1], change)
        # The index has not seen that patch yet: the conditions the writers'
        # check rewrites must be the ones just written, not the stale ones.
        _check_writers(key, policy, drainers, body, {**status, **change})


def _check_writers(key: Key, p: pol.Policy, drainers: list[allocation.DrainingPod],
                   body: Mapping[str, Any], status: Mapping[str, Any]) -> None:
    """WritersConsistent on the policy, and a Warning event when it turns False."""
    check = st.writers_check([(d.pod, d.writer, d.workload_writers) for d in drainers],
                             p.writers)
    change = st.with_writers(status, check,
                             body.get("metadata", {}).get("generation"), _now())
    if change is None:
        return
    kube.patch_status(api.POLICIES, key[0], key[1], change)
    if not check[0]:
        kube.post_event(body, api.KIND_POLICY, check[1], check[2])


def _schedule_rebalance(key: Key, cfg: OperatorConfig, policies: kopf.Index[Key, Any],
                        pods: kopf.Index[Key, Any], logger: logging.Logger,
                        delay: float = REBALANCE_DELAY_S) -> None:
    """Rebalance `key` soon, once, however many events ask (indexes are live views);
    JOINT: every policy whose joint budget moved."""
    def run() -> None:
        if key == JOINT:
            _rebalance_moved(cfg, policies, pods, logger)
        else:
            _rebalance(key, cfg, policies, pods, logger)

    _rebalances.schedule(key, run, logger, delay)


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
    _schedule_rebalance(key, memo.config, checkpointpolicy_index, pod_index, logger)
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
        _schedule_peers(key, memo.config, checkpointpolicy_index, peer_pod_index,
                        checkpoint_index, logger, progress_index)
    policy_there = bool(_values(checkpointpolicy_index, key))
    if goodput_sync.observe(key, meta.get("name", ""), meta, deleted=deleted,
                            has_policy=policy_there):
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
    """One goodput fold per policy for a burst of pod events (goodput_sync.py)."""
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
                              next(iter(_values(policies, key)), None), _locks[key], logger)
        # The recovery point on node loss moves with the writers' claims.
        _schedule_peers(key, memo.config, policies, peer_pods, checkpoints, logger, progress)

    _record_passes.schedule((key, record), run, logger, RECORD_DELAY_S)


# -- the peer tier: Secrets, the peers ConfigMap, status (peer_sync.py) ---------


def _schedule_peers(key: Key, cfg: OperatorConfig, policies: kopf.Index[Key, Any],
                    pods: kopf.Index[Key, Any], checkpoints: kopf.Index[Key, Any],
                    logger: logging.Logger, progress: kopf.Index[Key, Any]) -> None:
    """One coalesced peer-tier pass for `key`, if its policy has or had the tier."""
    body = next(iter(_values(policies, key)), None)
    if body is None:
        return
    wanted = ((body.get("spec") or {}).get("peerTier") or {}).get("enabled")
    had = ((body.get("status") or {}).get("peer") or {}).get("enabled")
    if not wanted and not had:
        return  # never on: nothing to publish, nothing to clear

    def run() -> None:
        current = next(iter(_values(policies, key)), None)
        if current is None:
            return
        try:
            parsed: pol.Policy | None = _parse(cfg, current, 1)
        except InvalidInput:
            parsed = None
        with metrics.reconciling("peers"):
            peer_sync.sync(key, parsed, current, _values(pods, key), _values(checkpoints, key),
                           logger, _values(progress, key))

    peer_sync.schedule(key, run, logger)
