"""Goodput into the policy status: the operator's thin edge of goodput.py.

Pods carry what their agent and restore saw (`ckptdrain.io/goodput`,
`ckptdrain.io/restore-result`); an index keeps the live pods' views, and
each pod event folds them (plus the event's own pod, which may be leaving)
into `status.goodput` with one status patch, only when something changed.
A failed restore also sets `status.lastRestoreFailure` and posts a Warning.

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

from ckptdrain import goodput
from ckptdrain.contract import api
from ckptdrain.operator import goodput_metrics, kube

Key = tuple[str, str]
_locks: defaultdict[Key, threading.Lock] = defaultdict(threading.Lock)
_written: dict[Key, dict[str, Any]] = {}
_failures: dict[Key, dict[str, Any]] = {}
#: What of each pod's view the status depends on, as last folded: most pod
#: events (pending bytes, shares, blocked seconds moving) change none of it
#: and then cost no pass over the policy's pods. One entry per pod.
_seen: dict[tuple[str, str], tuple[Any, ...]] = {}
_seen_lock = threading.Lock()


def _signature(view: goodput.PodView) -> tuple[Any, ...]:
    a = view.agent
    return (view.writer, None if a is None else (a.interrupted_at, a.training_at, a.step),
            view.restore)


@kopf.index("v1", "pods", annotations={api.ANNOTATION_INJECTED: kopf.PRESENT})
def goodput_index(namespace: str, name: str, meta: kopf.Meta, **_: Any
                  ) -> dict[Key, goodput.PodView] | None:
    if meta.get("deletionTimestamp"):
        return None  # leaving: the event that removes it brings its last view
    view = goodput.pod_view(name, meta)
    if view is None:
        return None
    return {(namespace, (meta.get("annotations") or {}).get(api.ANNOTATION_POLICY, "")): view}


def _since(policy: Mapping[str, Any]) -> float:
    created = (policy.get("metadata") or {}).get("creationTimestamp")
    try:
        return api.parse_timestamp(str(created)).timestamp()
    except ValueError:
        return datetime.now(UTC).timestamp()


def observe(key: Key, name: str, meta: Mapping[str, Any], policy: Mapping[str, Any] | None,
            live: list[goodput.PodView], deleted: bool = False) -> None:
    """Fold one pod event into the policy's goodput status (and its failure, if any)."""
    mine = goodput.pod_view(name, meta)
    pod_key = (key[0], name)
    if mine is None or policy is None:
        return
    signature = _signature(mine)
    with _seen_lock:
        if deleted:
            seen = _seen.pop(pod_key, None)
        else:
            seen, _seen[pod_key] = _seen.get(pod_key), signature
    if seen == signature:
        return
    try:
        _fold(key, name, mine, policy, live)
    except Exception:
        with _seen_lock:  # not folded: the pod's next event tries again
            _seen.pop(pod_key, None)
        raise


def _fold(key: Key, name: str, mine: goodput.PodView, policy: Mapping[str, Any],
          live: list[goodput.PodView]) -> None:
    pods = [p for p in live if p.name != name] + [mine]
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
        failure = goodput.restore_failure([mine])
        before = _failures.get(key) or status.get("lastRestoreFailure")
        if failure is not None and (before is None or failure["startedAt"] > float(
                before.get("startedAt") or 0)):
            change["lastRestoreFailure"] = failure
        if not change:
            return
        kube.patch_status(api.POLICIES, key[0], key[1], change)
        if new is not None:
            _written[key] = new
            goodput_metrics.publish(key, new)
        if "lastRestoreFailure" in change:
            _failures[key] = failure  # type: ignore[assignment]
            kube.post_event(policy, api.KIND_POLICY, "RestoreFailed",
                            f"pod {name} (writer {mine.writer}): restore "
                            f"{failure['outcome']}: {failure['reason']}")  # type: ignore[index]


def forget(key: Key) -> None:
    """A deleted policy: drop what is kept for it."""
    _written.pop(key, None)
    _failures.pop(key, None)
    goodput_metrics.forget(key)
