"""The operator's thin edge of conflicts.py: at the end of each recency pass
of a policy whose workloads Kueue queues (recency/publish.py hands over the
Kueue Workloads it found), read what the checks need (reads.py), and say
what they find:

- the policy's KueueCompatible condition, written only when its status,
  reason or message change, and removed (with the policy's gauges) once
  none of its workloads is queued, its job gone or Kueue not installed:
  recency runs this check on those passes too;
- a Warning Event on the Workload, once per Workload and reason (an
  operator restarted says it once more);
- ckptdrain_kueue_conflicts{namespace, policy, reason}, the number of each.

A read that fails, or a Workload none of whose pod sets is found to be
the policy's, leaves what it would check unknown (no conflict claimed for
it); the condition says what was not checked.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import kopf
from prometheus_client import Gauge

from ckptdrain import units
from ckptdrain.contract import api
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.admission import resources
from ckptdrain.operator.admission.injection import AGENT as AGENT_CONTAINER
from ckptdrain.operator.apiserver import class_view, kube, leadership, policy_edge
from ckptdrain.operator.bandwidth import rebalance
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.containers import AGENT, PEER
from ckptdrain.operator.kueue import conflicts, reads
from ckptdrain.operator.policy import classes
from ckptdrain.operator.policy import spec as pol
from ckptdrain.operator.policy import status as st
from ckptdrain.operator.policy.peer_tier import PEER as PEER_CONTAINER
from ckptdrain.operator.recency import after_pass, owners
from ckptdrain.operator.recency import kueue as recency_kueue
from ckptdrain.quantity import parse_quantity

Key = tuple[str, str]
#: The labels JobSet adds to its pods, not in the replicatedJob template
#: Kueue copies into the pod set (named after the replicatedJob).
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"

CONFLICTS = Gauge("ckptdrain_kueue_conflicts",
                  "Conflicts between Kueue's settings and the policy's, by the reason of the "
                  "policy's KueueCompatible condition (docs/kueue.md)",
                  ["namespace", "policy", "reason"])

log = logging.getLogger(__name__)
_lock = threading.Lock()
#: Per policy: (Workload uid, reason) whose Event is posted, for its
#: Workloads of the last pass only.
_posted: dict[Key, set[tuple[str, str]]] = {}
#: Per policy: the reasons whose gauge is set.
_gauged: dict[Key, set[str]] = {}


_config: list[OperatorConfig] = []


def start(cfg: OperatorConfig) -> None:
    """Check at the end of every recency pass (operator start)."""
    _config[:] = [cfg]
    if _after_pass not in after_pass.HOOKS:
        after_pass.HOOKS.append(_after_pass)


def _after_pass(key: Key, body: dict[str, Any] | None, queued: list[owners.Owner],
                logger: logging.Logger) -> None:
    if _config:
        check(_config[0], key, body, queued, logger)


def _amounts(raw: Mapping[str, str]) -> dict[str, Fraction]:
    return {k: parse_quantity(k, v) for k, v in raw.items()}


def facts_of(policy: pol.Policy, status: Mapping[str, Any] | None = None,
             cls: classes.CheckpointClass | None = None) -> conflicts.PolicyFacts:
    """What the checks need of a parsed policy: its retryDeadline, one
    restore (a checkpoint over the bandwidth the operator allows the policy,
    `status.allowedBandwidthBytes`, cluster cap included; its sizing's
    where the status has none yet), its placement and its class's
    nodeSelector (`cls`), and the requests of the
    containers that run beside the trainer (the agent; the peer sidecar)."""
    sized = pol.compute_sizing(policy)
    allowed = (status or {}).get("allowedBandwidthBytes")
    if isinstance(allowed, int) and not isinstance(allowed, bool) and allowed > 0:
        rate_bytes = float(allowed)
        bound = "the bandwidth the operator allows the policy, status.allowedBandwidthBytes"
    else:
        rate_bytes = sized.allowed_bandwidth
        bound = (f"its sizing, {sized.binding_cap} cap" if sized.binding_cap else
                 "its sizing, what its interval needs, no cap set")
    restore_s = sized.checkpoint_bytes / rate_bytes if rate_bytes > 0 else None
    basis = (f"one checkpoint, {units.format_bytes(sized.checkpoint_bytes)}, at "
             f"{units.format_rate(rate_bytes)} ({bound}): "
             f"{units.format_duration(restore_s or 0.0)}" if restore_s is not None else
             "no bandwidth known")
    names = [AGENT] + ([PEER] if policy.peer.enabled else [])
    shaped = {equal: {} for equal in (False, True)}
    for equal, total in shaped.items():
        for name in names:
            asked = resources.injected(name, policy.containers, equal=equal)["requests"]
            for resource, amount in _amounts(asked).items():
                total[resource] = total.get(resource, Fraction(0)) + amount
    terms = [{"matchExpressions": list(policy.node_expressions)}] \
        if policy.node_expressions else []
    return conflicts.PolicyFacts(
        retry_deadline_s=policy.restore_retry_deadline_s, restore_s=restore_s,
        restore_basis=basis, placement_terms=terms, injected=shaped[False],
        injected_names=[AGENT_CONTAINER] + ([PEER_CONTAINER] if policy.peer.enabled else []),
        injected_guaranteed=shaped[True],
        class_selector=dict(cls.placement.node_selector) if cls is not None else {},
        class_name=cls.name if cls is not None else "")


def check(cfg: OperatorConfig, key: Key, body: dict[str, Any] | None,
          queued: list[owners.Owner], logger: logging.Logger) -> None:
    """Check the policy against Kueue and say what was found; with nothing
    queued (or Kueue not served) say nothing: what was said goes."""
    if body is None or not queued or recency_kueue.served() is None:
        _clear(key, body, logger)
        return
    try:
        catalogue = class_view.current(classes.catalogue)
        policy = rebalance.parse_policy(cfg, body, drainers=1, catalogue=catalogue)
        cls = classes.choose(body.get("spec") or {}, catalogue).cls
        facts = facts_of(policy, body.get("status"),
                         cls if isinstance(cls, classes.CheckpointClass) else None)
    except InvalidInput:
        return  # an invalid policy's conditions say so already; nothing to check
    found: list[conflicts.Conflict] = []
    notes: list[str] = []
    uids: dict[str, owners.Owner] = {}
    for owner in queued:
        try:
            workload = reads.workload(owner.api_version, key[0], owner.name)
        except (kube.ApiException, kube.HTTPError) as error:
            notes.append(f"Workload {owner.name} not read ({type(error).__name__})")
            continue
        if workload is None:
            continue
        uids[owner.uid] = owner
        found += _workload_conflicts(policy, facts, owner, workload, notes)
    if not uids and not notes:
        _clear(key, body, logger)  # every Workload gone: none queued now
        return
    if policy.restore_enabled:
        wait, why = reads.wait_for_pods_ready(cfg.kueue_config)
        found += conflicts.wait_for_pods_ready(wait, facts)
        if why:
            notes.insert(0, f"waitForPodsReady not checked: {why}")
    _say(key, body, found, notes, logger)
    _post_events(key, uids, found, logger)


def _ours(policy: pol.Policy, workload: Mapping[str, Any], pod_set: Mapping[str, Any]) -> bool:
    """Whether the policy selects the pods of this pod set: its template's
    labels, with those JobSet adds to each pod (its name, from the
    Workload's owner, and the replicatedJob's, the pod set's)."""
    labels = dict(((pod_set.get("template") or {}).get("metadata") or {}).get("labels") or {})
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "JobSet" and str(ref.get("apiVersion", "")).startswith(
                "jobset.x-k8s.io/"):
            labels.setdefault(JOBSET_NAME, str(ref.get("name", "")))
            labels.setdefault(REPLICATED_JOB, str(pod_set.get("name", "")))
    return labels.get(api.LABEL_INJECT) == "true" and \
        pol.selector_matches(policy.selector, labels)


def _workload_conflicts(policy: pol.Policy, facts: conflicts.PolicyFacts,
                        owner: owners.Owner, workload: dict[str, Any],
                        notes: list[str]) -> list[conflicts.Conflict]:
    sets = [s for s in (workload.get("spec") or {}).get("podSets") or []
            if _ours(policy, workload, s)]
    if not sets:
        notes.append(f"Workload {owner.name} not checked: none of its pod sets' templates "
                     f"has {api.LABEL_INJECT}: \"true\" and labels spec.selector matches")
        return []
    out: list[conflicts.Conflict] = []
    evicted = conflicts.evicted(workload)
    if evicted is not None and policy.restore_enabled:
        out.append(evicted)
    group = owner.api_version.rpartition("/")[0]
    version = owner.api_version.rpartition("/")[2]
    for flavor in conflicts.flavors_of(workload, {str(s.get("name")) for s in sets}):
        labels = reads.flavor_labels(f"{group}/{version}", flavor)
        if labels is None:
            notes.append(f"ResourceFlavor {flavor} not read")
            continue
        outside = conflicts.flavor_outside(workload, flavor, labels, facts)
        if outside is not None:
            out.append(outside)
    quota = conflicts.quota(workload, sets, facts, lambda template: resources.stays_guaranteed(
        template, policy.containers))
    if quota is not None:
        out.append(quota)
    return out


def _say(key: Key, body: dict[str, Any], found: list[conflicts.Conflict], notes: list[str],
         logger: logging.Logger) -> None:
    """The condition, where it changed, and the gauges."""
    want = conflicts.condition(found, notes)
    _gauge(key, found)
    _write(key, body, want, logger)


def _clear(key: Key, body: dict[str, Any] | None, logger: logging.Logger) -> None:
    """Nothing of the policy's is queued: no condition, no gauges, no Events kept."""
    _gauge(key, [])
    with _lock:
        _posted.pop(key, None)
        _gauged.pop(key, None)
    if body is not None:
        _write(key, body, None, logger)


def _write(key: Key, body: dict[str, Any], want: dict[str, str] | None,
           logger: logging.Logger) -> None:
    """The condition as `want` (None: removed), written only where it changes."""

    def change_of(current: dict[str, Any]) -> dict[str, Any] | None:
        previous = (current.get("status") or {}).get("conditions") or []
        have = next((c for c in previous if c.get("type") == conflicts.CONDITION), None)
        kept = [c for c in previous if c.get("type") != conflicts.CONDITION]
        if want is None:
            return None if have is None else {"conditions": kept}
        if have is not None and all(have.get(k) == want[k]
                                    for k in ("status", "reason", "message")):
            return None
        generation = (current.get("metadata") or {}).get("generation")
        made = st.condition(conflicts.CONDITION, want["status"] == "True", want["reason"],
                            want["message"], generation, datetime.now(UTC), previous)
        return {"conditions": [*kept, made]}

    try:
        if kube.write_status_from(api.POLICIES, key[0], body, change_of, attempts=3):
            logger.info("policy %s/%s: %s %s", *key, conflicts.CONDITION,
                        f"{want['status']} ({want['reason']})" if want else "removed")
    except (kube.ApiException, kube.HTTPError, RuntimeError) as error:
        logger.warning("policy %s/%s: %s not written: %s", *key, conflicts.CONDITION, error)


def _gauge(key: Key, found: list[conflicts.Conflict]) -> None:
    counts: dict[str, int] = {}
    for c in found:
        counts[c.reason] = counts.get(c.reason, 0) + 1
    with _lock:
        before = _gauged.get(key, set())
        _gauged[key] = set(counts)
    for reason in before - set(counts):
        CONFLICTS.remove(key[0], key[1], reason)
    for reason, count in counts.items():
        CONFLICTS.labels(key[0], key[1], reason).set(count)


def _post_events(key: Key, workloads: dict[str, owners.Owner],
                 found: list[conflicts.Conflict], logger: logging.Logger) -> None:
    """A Warning Event on each Workload, once per Workload and reason; a
    conflict of Kueue's configuration on each of the policy's Workloads."""
    by_name = {o.name: o for o in workloads.values()}
    pairs = [(o, c) for c in found
             for o in ([by_name[c.workload]] if c.workload in by_name else
                       list(by_name.values()) if not c.workload else [])]
    with _lock:  # a Workload gone, or no longer in conflict, is forgotten
        posted = _posted.setdefault(key, set())
        posted.intersection_update({(o.uid, c.reason) for o, c in pairs})
    for owner, c in pairs:
        with _lock:
            first = (owner.uid, c.reason) not in posted
            posted.add((owner.uid, c.reason))
        if not first:
            continue
        body = {"metadata": {"name": owner.name, "namespace": key[0], "uid": owner.uid}}
        try:
            kube.post_event(body, "Workload", c.reason, f"CheckpointPolicy {key[1]}: "
                            f"{c.message}", api_version=owner.api_version)
        except (kube.ApiException, kube.HTTPError) as error:
            with _lock:
                posted.discard((owner.uid, c.reason))
            logger.warning("Workload %s/%s: Event %s not posted: %s", key[0], owner.name,
                           c.reason, error)


@kopf.on.event(*policy_edge.RESOURCE)
def checkpointpolicy_kueue_event(event: kopf.RawEvent, namespace: str, name: str,
                                 **_: Any) -> None:
    """A deleted policy's gauges go with it."""
    if event.get("type") == "DELETED":
        with _lock:
            reasons = _gauged.pop((namespace, name), set())
            _posted.pop((namespace, name), None)
        for reason in reasons:
            CONFLICTS.remove(namespace, name, reason)


def forget() -> None:
    """A new term, or a standby: say everything again, no gauges."""
    with _lock:
        gauged = dict(_gauged)
        _gauged.clear()
        _posted.clear()
    for key, reasons in gauged.items():
        for reason in reasons:
            CONFLICTS.remove(key[0], key[1], reason)
    reads.forget()


leadership.on_new_term(forget)
