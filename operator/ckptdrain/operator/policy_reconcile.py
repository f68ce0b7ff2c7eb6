"""A CheckpointPolicy's reconcile: its class and spec judged, its sizing
under the joint bandwidth budget, its status written, and the passes that
follow it scheduled (rebalance, peer tier). Called by the policy's own
handlers (handlers.py) and by class events (class_events.py)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import kopf

from ckptdrain.errors import InvalidInput
from ckptdrain.operator import metrics
from ckptdrain.operator.admission import census
from ckptdrain.operator.bandwidth import rebalance
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.peers import sync as peer_sync
from ckptdrain.operator.policy import history, readiness, version_messages
from ckptdrain.operator.policy import spec as pol
from ckptdrain.operator.policy import status as st
from ckptdrain.operator.records import sync as record_sync
from ckptdrain.operator.records import watchdog

Key = tuple[str, str]
values = rebalance.values


def now() -> datetime:
    return datetime.now(UTC)


def reconcile_policy(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo,
                     logger: logging.Logger, pod_index: kopf.Index[Key, Any],
                     checkpointpolicy_index: kopf.Index[Key, Any],
                     checkpoint_index: kopf.Index[Key, Any],
                     peer_pod_index: kopf.Index[Key, Any],
                     progress_index: kopf.Index[Key, Any], announce: bool) -> None:
    cfg: OperatorConfig = memo.config
    watchdog.start(cfg, checkpointpolicy_index, pod_index, checkpoint_index,
                   lambda: rebalance.budgets(cfg, checkpointpolicy_index, pod_index), logger)
    key = (body.metadata.namespace or "", body.metadata.name or "")
    drainers = len(values(pod_index, key))
    generation = body.metadata.get("generation")
    previous = body.status.get("conditions", [])
    with metrics.reconciling("checkpointpolicy"):
        resolved_class = rebalance.class_condition(cfg, body)
        try:
            parsed = rebalance.parse_policy(cfg, dict(body), drainers)
            sized = pol.compute_sizing(parsed)
        except InvalidInput as error:
            # Each problem said in the version its field was written at,
            # which the object's managedFields tell (policy/version_messages.py).
            message = version_messages.message(error, version_messages.versions_of(body))
            patch.status.update(st.for_invalid(message, generation, now(), previous,
                                               resolved_class))
            kopf.warn(body, reason="InvalidSpec", message=message)
            schedule_peers(key, cfg, checkpointpolicy_index, peer_pod_index,
                            checkpoint_index, logger, progress_index)
            return
        joint = rebalance.budgets(cfg, checkpointpolicy_index, pod_index, {key: parsed})
        cluster = None
        if key in joint:
            sized, cluster = joint[key][0], joint[key][1]
        # The pods under this spec's selector, counted now: Ready is never
        # True for a moment before the census runs (policy/status.py).
        # While a new term waits for its LIST, a counted policy's pods part
        # stays as it was: the census counts it after the LIST.
        counted = body.status.get("pods")
        pods = census.policy_census(key[0], key[1], parsed.selector, now(),
                                    cfg.starting_limit_s, counted_before=counted is not None)
        new = st.for_sizing(sized, generation, now(), previous, active_drainers=drainers,
                            cluster=cluster, resource_notes=parsed.resource_notes,
                            unprotected=pods.unprotected if pods else None,
                            selected=pods.selected if pods else 0,
                            class_resolved=resolved_class)
        new["drainers"] = drainers
        new["pods"] = readiness.pods_field(pods.counts(), generation) if pods else dict(counted)
        new["storage"] = history.storage_status(body, parsed, now(), lambda: (  # moves
            record_sync.completions(key, values(checkpoint_index, key), logger)))
        patch.status.update(new)
        census.after_sizing(*key)  # Kopf writes `new` unversioned: recount over it
    if announce:
        kopf.info(body, reason="Sized", message=st.sizing_summary(new))
        if sized.bandwidth_constrained:
            kopf.warn(body, reason="BandwidthConstrained", message=new["conditions"][2]["message"])
    logger.info("sized: %s", st.sizing_summary(new))
    rebalance.schedule(key, cfg, checkpointpolicy_index, pod_index, logger)
    rebalance.schedule(rebalance.JOINT, cfg, checkpointpolicy_index, pod_index, logger)
    schedule_peers(key, cfg, checkpointpolicy_index, peer_pod_index, checkpoint_index,
                    logger, progress_index)


#: The hourly pass of every policy is nobody's event: its own log.
_peer_log = logging.getLogger("ckptdrain.peer_tier")


def schedule_peers(key: Key, cfg: OperatorConfig, policies: kopf.Index[Key, Any],
                    pods: kopf.Index[Key, Any], checkpoints: kopf.Index[Key, Any],
                    logger: logging.Logger, progress: kopf.Index[Key, Any]) -> None:
    """One coalesced peer-tier pass for `key`, if its policy has or had the tier."""

    def uids() -> set[str]:
        return {b["metadata"].get("uid") for k in list(policies) for b in values(policies, k)}

    def run_all() -> None:
        for other in list(policies):
            schedule_peers(other, cfg, policies, pods, checkpoints, _peer_log, progress)

    peer_sync.start_upkeep(cfg.peer_ca_namespace, cfg.peering, uids, run_all)
    body = next(iter(values(policies, key)), None)
    if body is None:
        return
    wanted = ((body.get("spec") or {}).get("peerTier") or {}).get("enabled")
    had = ((body.get("status") or {}).get("peer") or {}).get("enabled")
    if not wanted and not had:
        return  # never on: nothing to publish, nothing to clear

    def run() -> None:
        current = next(iter(values(policies, key)), None)
        if current is None:
            return
        try:
            parsed: pol.Policy | None = rebalance.parse_policy(cfg, current, 1)
        except InvalidInput:
            parsed = None
        with metrics.reconciling("peers"):
            peer_sync.sync(key, parsed, current, values(pods, key), values(checkpoints, key),
                           logger, values(progress, key), cfg.peer_ca_namespace,
                           cfg.peering)

    peer_sync.schedule(key, run, logger)
