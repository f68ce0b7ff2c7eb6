"""A CheckpointPolicy's reconcile: its class and spec judged, its sizing
under the joint bandwidth budget, its status written, and the passes that
follow it scheduled (rebalance, peer tier). Called by the policy's own
handlers (handlers.py) and by class events (class_events.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import kopf

from ckptdrain.contract import api
from ckptdrain.errors import InvalidInput
from ckptdrain.operator import metrics
from ckptdrain.operator.admission import census
from ckptdrain.operator.apiserver import kube, namespace_labels, policy_edge
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


#: How soon a reconcile that could not read its namespace's labels is retried.
LABELS_RETRY_S = 30.0
#: Status writes that lost to a newer version in a row before a reconcile
#: gives up (Kopf retries the handler after its backoff).
WRITE_ATTEMPTS = 5


def reconcile_policy(body: kopf.Body, memo: kopf.Memo,
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
    with metrics.reconciling("checkpointpolicy"):
        try:
            resolved_class = rebalance.class_condition(cfg, body)
            parsed = rebalance.parse_policy(cfg, dict(body), drainers)
            sized = pol.compute_sizing(parsed)
        except namespace_labels.LabelsUnreadable as error:
            # No judgement without the labels: the status stays as it was
            # (an unreadable namespace is not a disallowed one); Kopf retries
            # the handler, the Coalescer a class event's pass.
            raise kopf.TemporaryError(f"{error}; judged again in {LABELS_RETRY_S:g}s",
                                      delay=LABELS_RETRY_S) from None
        except InvalidInput as error:
            # Each problem said in the version its field was written at,
            # which the object's managedFields tell (policy/version_messages.py).
            message = version_messages.message(error, version_messages.versions_of(body))
            written = write_status(key, body, lambda current: st.for_invalid(
                message, _generation(current), now(), _conditions(current), resolved_class))
            # The peer tier first: an Event that cannot be posted must not
            # leave an invalid policy's peers published.
            schedule_peers(key, cfg, checkpointpolicy_index, peer_pod_index,
                            checkpoint_index, logger, progress_index)
            if written is not None:
                kopf.warn(_subject(body), reason="InvalidSpec", message=message)
            return
        joint = rebalance.budgets(cfg, checkpointpolicy_index, pod_index, {key: parsed})
        cluster = None
        if key in joint:
            sized, cluster = joint[key][0], joint[key][1]

        def sized_status(current: dict[str, Any]) -> dict[str, Any]:
            status, generation = current.get("status") or {}, _generation(current)
            # The pods under this spec's selector, counted now: Ready is never
            # True for a moment before the census runs (policy/status.py).
            # While a new term waits for its LIST, a counted policy's pods
            # part stays as it was: the census counts it after the LIST.
            pods = census.policy_census(key[0], key[1], parsed.selector, now(),
                                        cfg.starting_limit_s,
                                        counted_before=status.get("pods") is not None)
            new = st.for_sizing(sized, generation, now(), _conditions(current),
                                active_drainers=drainers, cluster=cluster,
                                resource_notes=parsed.resource_notes,
                                unprotected=pods.unprotected if pods else None,
                                selected=pods.selected if pods else 0,
                                class_resolved=resolved_class)
            new["drainers"] = drainers
            if pods:
                new["pods"] = readiness.pods_field(pods.counts(), generation)
            new["storage"] = history.storage_status(current, parsed, now(), lambda: (  # moves
                record_sync.completions(key, values(checkpoint_index, key), logger)))
            return new

        new = write_status(key, body, sized_status)
    if new is None:
        logger.info("sizing not written: the policy changed or went meanwhile")
        return
    if announce:
        kopf.info(_subject(body), reason="Sized", message=st.sizing_summary(new))
        if sized.bandwidth_constrained:
            kopf.warn(_subject(body), reason="BandwidthConstrained",
                      message=new["conditions"][2]["message"])
    logger.info("sized: %s", st.sizing_summary(new))
    rebalance.schedule(key, cfg, checkpointpolicy_index, pod_index, logger)
    rebalance.schedule(rebalance.JOINT, cfg, checkpointpolicy_index, pod_index, logger)
    schedule_peers(key, cfg, checkpointpolicy_index, peer_pod_index, checkpoint_index,
                    logger, progress_index)


def _subject(body: kopf.Body) -> kopf.Body:
    """The policy as its Events name it: at v1beta1, not the core's v1alpha1."""
    return kopf.Body(policy_edge.event_subject(body))


def _conditions(current: dict[str, Any]) -> list[dict[str, Any]]:
    return list((current.get("status") or {}).get("conditions") or [])


def _generation(current: dict[str, Any]) -> int | None:
    return (current.get("metadata") or {}).get("generation")


def write_status(key: Key, body: kopf.Body,
                 status_of: Callable[[dict[str, Any]], dict[str, Any]]
                 ) -> dict[str, Any] | None:
    """Write `status_of(policy)` at the resourceVersion it was computed from;
    on a conflict read the policy again and compute anew. Every writer of the
    conditions list does so: a merge patch replaces the whole list, so a
    write computed from an older read would drop a condition another writer
    set meanwhile (the census's Ready, the sweep's PodsUnprotected). A policy
    whose spec differs from `body`'s now, or that is gone, is not written:
    the newer spec's own reconcile writes. The spec is compared, not the
    generation: a spec changed and changed back while this ran gets no
    reconcile of its own (Kopf sees no difference), so this one writes, at
    the current generation. Returns what was written."""
    spec = dict(body).get("spec")
    written: list[dict[str, Any]] = []

    def change_of(current: dict[str, Any]) -> dict[str, Any] | None:
        if current.get("spec") != spec:
            return None
        written[:] = [status_of(current)]
        return written[0]

    if not kube.write_status_from(api.POLICIES, key[0], dict(body), change_of,
                                  WRITE_ATTEMPTS):
        return None
    return written[0]


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
