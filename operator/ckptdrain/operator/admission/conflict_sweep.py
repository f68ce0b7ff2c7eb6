"""Overlapping policies that got past admission, marked on both.

Admission refuses a policy whose selector overlaps another's
(admission/policy_rules.py), but two created at the same instant, or while
the webhook was not answering, are both stored; every pod both select is
then refused at pod admission. This pass finds such pairs among the
policies of a namespace (policy/conflicts.py) and sets the Conflicting
condition on each, naming the other and a label set both select, with the
phase Conflicting; when the overlap ends (a selector changed, one policy
deleted) the condition turns False and the phase is what the other
conditions say.

Finding overlaps compares every pair of a namespace's policies, so it runs
only when what decides them changed (a fingerprint per namespace of the
names, selectors and deletion marks: policy/conflicts.py) and otherwise
reuses what the last pass found; a policy event whose stored Conflicting
condition differs from that (a sizing patch written from an older status
dropped it) schedules a pass that puts it back. Each write is a status
patch at the resourceVersion read, retried on a conflict from a fresh read,
so it never reverts conditions another writer set meanwhile. A failed write
fails the pass after the namespace's other policies were tried, and the
Coalescer retries it. Kopf runs event handlers on the active replica only.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Any

import kopf

from ckptdrain.contract import api
from ckptdrain.operator.apiserver import kube
from ckptdrain.operator.coalesce import Coalescer
from ckptdrain.operator.policy import conflicts

POLICIES = (api.GROUP, api.VERSION, api.POLICIES)
#: Policy events within this window are one pass per namespace.
PASS_DELAY_S = 0.5
#: Status writes of one policy in a row that may meet a newer version.
WRITE_ATTEMPTS = 5

_passes = Coalescer("marking overlapping policies")
Found = dict[str, conflicts.Overlap | None]
#: Per namespace: the fingerprint of the last pass and what it found.
_found: dict[str, tuple[conflicts.Fingerprint, Found]] = {}
_found_lock = threading.Lock()


def _bodies(namespace: str, policies: kopf.Index[Any, Any]) -> list[dict[str, Any]]:
    return [b for key in list(policies) if key[0] == namespace
            for b in policies.get(key, []) if b]


def overlaps(namespace: str, bodies: list[dict[str, Any]]) -> Found:
    """Each policy's first overlap: found again only when the namespace's
    fingerprint changed since the last time."""
    mark = conflicts.fingerprint(bodies)
    with _found_lock:
        last = _found.get(namespace)
    if last is not None and last[0] == mark:
        return last[1]
    found = conflicts.find(bodies)
    with _found_lock:
        _found[namespace] = (mark, found)
    return found


def _change(body: dict[str, Any], overlap: conflicts.Overlap | None) -> dict[str, Any] | None:
    return conflicts.with_conflict(body.get("status") or {}, overlap,
                                   body["metadata"].get("generation"), datetime.now(UTC))


def _write(namespace: str, body: dict[str, Any], overlap: conflicts.Overlap | None) -> bool:
    """Set the condition on one policy unless it is right; True when written."""
    name = body["metadata"]["name"]
    for _ in range(WRITE_ATTEMPTS):
        change = _change(body, overlap)
        if change is None:
            return False
        version = str(body["metadata"].get("resourceVersion") or "")
        result = kube.patch_status_at(api.POLICIES, namespace, name, change, version)
        if result == "ok":
            return True
        if result == "gone":
            return False
        fresh = kube.read_own(api.POLICIES, namespace, name)
        if fresh is None:
            return False
        body = fresh
    raise RuntimeError(f"policy {namespace}/{name} changed under {WRITE_ATTEMPTS} status "
                       "writes in a row; trying again later")


def mark_namespace(namespace: str, policies: kopf.Index[Any, Any],
                   logger: logging.Logger) -> int:
    """Set Conflicting on the policies of `namespace` where it is not right;
    returns how many overlap another. Raises the first failure after trying
    every policy."""
    bodies = _bodies(namespace, policies)
    found = overlaps(namespace, bodies)
    failed: Exception | None = None
    for body in bodies:
        overlap = found.get(body["metadata"]["name"])
        try:
            if _write(namespace, body, overlap) and overlap is not None:
                logger.warning("policy %s/%s: %s", namespace, body["metadata"]["name"],
                               conflicts.message(overlap))
        except (kube.ApiException, RuntimeError) as error:
            failed = failed or error
    if failed is not None:
        raise failed
    return sum(1 for o in found.values() if o is not None)


def pass_needed(namespace: str, body: dict[str, Any], policies: kopf.Index[Any, Any]) -> bool:
    """Whether a policy event calls for a pass: its namespace's fingerprint
    changed since the last, or the policy's stored condition is not what
    the last pass found."""
    mark = conflicts.fingerprint(_bodies(namespace, policies))
    with _found_lock:
        last = _found.get(namespace)
    if last is None or last[0] != mark:
        return True
    name = (body.get("metadata") or {}).get("name")
    return _change(body, last[1].get(str(name))) is not None


@kopf.on.event(*POLICIES)
def checkpointpolicy_conflicts(namespace: str, body: kopf.Body, logger: logging.Logger,
                               checkpointpolicy_index: kopf.Index[Any, Any],
                               **_: Any) -> None:
    """A policy came, changed or went: look at its namespace's overlaps soon,
    if anything that decides them (or its own condition) is not as last seen."""
    if pass_needed(namespace, dict(body), checkpointpolicy_index):
        _passes.schedule(namespace,
                         lambda: mark_namespace(namespace, checkpointpolicy_index, logger),
                         logger, PASS_DELAY_S)
