"""Goodput into the policy status: the operator's thin edge of goodput.py (and
of restore_status.py).

Pods carry what their agent and restore saw (`ckptdrain.io/goodput`,
`ckptdrain.io/restore-result`), and their status when they got a node and
ended; an index keeps the live pods' views. A pod
event that changes what the status depends on asks for a fold (`observe`),
and one coalesced fold per policy takes in every view (plus those of pods
that left since) with one status patch, only when something changed.
A failed restore also sets `status.lastRestoreFailure` and posts a Warning;
the ranks' newest restore agreement goes into `status.lastRestoreAgreement`;
what checkpointing costs against its two rules into `status.checkpointCost`
(cost.py), when a verdict flips or a figure moves by more than 10%.

State lives in the status: a restarted operator re-reads it and merges the
same pods again to the same result (goodput.merge is idempotent). The last
status written is kept per policy, because the index may not have caught up
with our own previous patch when the next event comes.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from ckptdrain import goodput, restore_status
from ckptdrain.contract import api
from ckptdrain.contract.goodput import PodView, pod_view
from ckptdrain.operator.apiserver import kube, leadership
from ckptdrain.operator.coalesce import drop_handled
from ckptdrain.operator.goodput import cost
from ckptdrain.operator.goodput import metrics as goodput_metrics

Key = tuple[str, str]
_locks: defaultdict[Key, threading.Lock] = defaultdict(threading.Lock)
_written: dict[Key, dict[str, Any]] = {}
_failures: dict[Key, dict[str, Any]] = {}
_costs: dict[Key, dict[str, Any]] = {}
#: What of each pod's view the status depends on, as last folded: most pod
#: events (pending bytes, shares, blocked seconds moving by a little) change
#: none of it and then cost no pass over the policy's pods. One entry per pod.
_seen: dict[tuple[str, str], tuple[Any, ...]] = {}
_seen_lock = threading.Lock()
#: Per policy: views of pods deleted before a fold took in their last word.
_departed: dict[Key, dict[str, PodView]] = {}


def _signature(view: PodView) -> tuple[Any, ...]:
    a = view.agent
    return (view.writer, None if a is None else (a.interrupted_at, a.training_at, a.step),
            view.restore, view.bound_at, view.finished, view.finished_at,
            cost.pod_signature(view))


@kopf.index("v1", "pods", annotations={api.ANNOTATION_INJECTED: kopf.PRESENT})
def goodput_index(namespace: str, name: str, meta: kopf.Meta, status: kopf.Status,
                  **_: Any) -> dict[Key, PodView] | None:
    if meta.get("deletionTimestamp"):
        return None  # leaving: the event that removes it brings its last view
    view = pod_view(name, meta, status)
    if view is None:
        return None
    return {(namespace, (meta.get("annotations") or {}).get(api.ANNOTATION_POLICY, "")): view}


def _since(policy: Mapping[str, Any]) -> float:
    created = (policy.get("metadata") or {}).get("creationTimestamp")
    try:
        return api.parse_timestamp(str(created)).timestamp()
    except ValueError:
        return datetime.now(UTC).timestamp()


def observe(key: Key, name: str, meta: Mapping[str, Any], deleted: bool = False,
            has_policy: bool = True, status: Mapping[str, Any] | None = None) -> bool:
    """Whether this pod event changed what the policy's goodput status depends
    on: then a `fold` is due. A leaving pod's view is kept for that fold: the
    index keeps a terminating pod's previous view (its emergency checkpoint's
    interruption comes after) and drops a deleted pod's. Nothing is noted
    for a pod whose policy is not there (its views wait for it)."""
    mine = pod_view(name, meta, status)
    if mine is None or not has_policy:
        return False
    pod_key = (key[0], name)
    signature = _signature(mine)
    with _seen_lock:
        if deleted or meta.get("deletionTimestamp"):
            # Kept for the next fold, maybe one asked for earlier that has
            # not run yet (folding a view twice is harmless).
            if deleted:
                _seen.pop(pod_key, None)
            else:
                _seen[pod_key] = signature
            leaving = _departed.setdefault(key, {})
            leaving[name] = goodput.keep_interruption(leaving.get(name), mine)
            return True
        seen, _seen[pod_key] = _seen.get(pod_key), signature
    return seen != signature


def fold(key: Key, policy: Mapping[str, Any] | None, live: list[PodView]) -> None:
    """Every pod's view (the live ones, and those leaving or gone since the
    last fold) into the policy's `status.goodput`, with one status patch,
    only when something changed; and the newest failed restore, if newer
    than the one reported. One pass per policy for a burst of events: a
    job's restart is thousands of them."""
    if policy is None:  # gone: what its pods left goes with it
        with _seen_lock:
            _departed.pop(key, None)
        return
    with _seen_lock:
        departed = dict(_departed.get(key) or {})
    pods = [p for p in live if p.name not in departed] + list(departed.values())
    status = policy.get("status") or {}
    spec = policy.get("spec") or {}
    now = datetime.now(UTC).timestamp()
    blocked = sum(p.agent.blocked_s for p in pods
                  if p.agent is not None and p.agent.interrupted_at is None)
    with _locks[key]:
        current = _written.get(key) or status.get("goodput") or {}
        new = goodput.status_patch(current, pods, status.get("lastGlobalStep"),
                                   _since(policy), now, int(spec.get("writers") or 1), blocked)
        change: dict[str, Any] = {}
        if new is not None:
            change["goodput"] = new
        # Each as the apiserver stores it (api.as_stored), as `new` is: what
        # a restarted operator reads back is then what it would write.
        agreed = api.as_stored(restore_status.restore_agreement(pods))
        if agreed is not None and agreed != status.get("lastRestoreAgreement"):
            change["lastRestoreAgreement"] = agreed
        costs = api.as_stored(cost.checkpoint_cost(pods))
        if cost.changed(_costs.get(key) or status.get("checkpointCost"), costs):
            change["checkpointCost"] = costs
        failure = api.as_stored(restore_status.restore_failure(pods))
        before = _failures.get(key) or status.get("lastRestoreFailure")
        if failure is not None and (before is None or failure["startedAt"] > float(
                before.get("startedAt") or 0)):
            change["lastRestoreFailure"] = failure
        if change:
            bases = {"goodput": current, "lastRestoreAgreement": status.get(
                "lastRestoreAgreement"), "checkpointCost": _costs.get(key) or status.get(
                "checkpointCost"), "lastRestoreFailure": before}
            patch = {k: replacing(bases[k], v) for k, v in change.items()}
            if not kube.patch_status(api.POLICIES, key[0], key[1], patch):
                return  # the policy is gone: nothing to remember for it
            if new is not None:
                _written[key] = new
                goodput_metrics.publish(key, new)
            if "checkpointCost" in change:
                _costs[key] = costs  # type: ignore[assignment]
            if "lastRestoreFailure" in change:
                _failures[key] = failure  # type: ignore[assignment]
                kube.post_event(policy, api.KIND_POLICY, "RestoreFailed",
                                f"pod {failure['pod']} ({_who(failure)}): "  # type: ignore[arg-type]
                                f"restore {failure['outcome']}: "  # type: ignore[index]
                                f"{failure['reason']}")  # type: ignore[index]
    with _seen_lock:  # folded: no longer needed (a view that came since stays)
        drop_handled(_departed, key, departed)


def replacing(before: Any, after: Any) -> Any:
    """A merge patch that turns `before` into `after`: a merge patch keeps
    an object's keys it does not name, so each one `after` dropped is named
    null (else a new interruption in `lastInterruption` would show the
    restore of the one before it, and a status read back after a restart
    would differ from what was folded). Lists are replaced whole."""
    if not (isinstance(before, Mapping) and isinstance(after, Mapping)):
        return after
    return {**{k: None for k in before if k not in after},
            **{k: replacing(before.get(k), v) for k, v in after.items()}}


def _who(failure: Mapping[str, Any]) -> str:
    if failure.get("reader") is not None:
        return f"reader of shard {failure['reader']}"
    return f"writer {failure['writer']}"


def _new_term() -> None:
    """Another replica wrote the statuses while this one stood by."""
    _written.clear()
    _failures.clear()
    _costs.clear()


leadership.on_new_term(_new_term)


def forget(key: Key) -> None:
    """A deleted policy: drop what is kept for it."""
    with _seen_lock:
        _departed.pop(key, None)
    _written.pop(key, None)
    _failures.pop(key, None)
    _costs.pop(key, None)
    goodput_metrics.forget(key)
