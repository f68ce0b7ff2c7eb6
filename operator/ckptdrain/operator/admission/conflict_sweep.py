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

Comparing every pair of a namespace's policies on every event is seconds of
CPU at a thousand policies, so each namespace keeps its overlap graph
(policy/conflicts.py Overlaps), updated from each event. An event that left
the policy's selector and deletion mark as they were (a status write, a
label) costs a key comparison and a look at its own stored condition (a
sizing patch written from an older status may have dropped it); one that
changed them, a new policy or a deleted one, compares that policy with each
other once. The pass writes only the policies whose condition may have
changed: it, and those it overlapped before or overlaps now. Each write is
a status patch at the resourceVersion read, retried on a conflict from a
fresh read, so it never reverts conditions another writer set meanwhile. A
failed write fails the pass after the others were tried; the policy stays
due and the Coalescer retries. Kopf runs event handlers on the active
replica only. A policy whose DELETED event never came (a watch that
listed again) is dropped from the graph when a pass finds its overlap
naming a policy the index no longer holds.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Any

import kopf

from ckptdrain.contract import api
from ckptdrain.operator.apiserver import kube, policy_edge
from ckptdrain.operator.coalesce import Coalescer
from ckptdrain.operator.policy import conflicts

#: At v1beta1, the storage version (apiserver/policy_edge.py).
POLICIES = policy_edge.RESOURCE
#: Policy events within this window are one pass per namespace.
PASS_DELAY_S = 0.5
#: Status writes of one policy in a row that may meet a newer version.
WRITE_ATTEMPTS = 5

_passes = Coalescer("marking overlapping policies")
#: Per namespace: its overlap graph, and the policies due a look at their condition.
_graphs: dict[str, conflicts.Overlaps] = {}
_due: dict[str, set[str]] = {}
_lock = threading.Lock()


def observe(namespace: str, body: dict[str, Any], deleted: bool = False) -> set[str]:
    """Take one policy event; returns the policies now due a look at their
    Conflicting condition (and records them as due)."""
    name = str((body.get("metadata") or {}).get("name") or "")
    with _lock:
        graph = _graphs.setdefault(namespace, conflicts.Overlaps())
        if deleted:
            touched = graph.remove(name)
        else:
            touched = graph.update(name, body)
            if not touched and _change(body, graph.first(name)) is not None:
                touched = {name}
        if touched:
            _due.setdefault(namespace, set()).update(touched)
        return touched


def first_overlap(namespace: str, name: str,
                  policies: kopf.Index[Any, Any]) -> conflicts.Overlap | None:
    """What the graph says `name` overlaps first, among policies the index
    still holds."""
    with _lock:
        graph = _graphs.setdefault(namespace, conflicts.Overlaps())
        while (overlap := graph.first(name)) is not None \
                and _body(namespace, overlap[0], policies) is None:
            _due.setdefault(namespace, set()).update(graph.remove(overlap[0]) - {name})
        return overlap


def _change(body: dict[str, Any], overlap: conflicts.Overlap | None) -> dict[str, Any] | None:
    return conflicts.with_conflict(body.get("status") or {}, overlap,
                                   body["metadata"].get("generation"), datetime.now(UTC))


def _write(namespace: str, body: dict[str, Any], overlap: conflicts.Overlap | None) -> bool:
    """Set the condition on one policy unless it is right; True when written."""
    return kube.write_status_from(api.POLICIES, namespace, body,
                                  lambda current: _change(current, overlap), WRITE_ATTEMPTS)


def _body(namespace: str, name: str, policies: kopf.Index[Any, Any]) -> dict[str, Any] | None:
    # A copy: the index changes under the watch while the pass runs.
    found = [b for b in list(policies.get((namespace, name), [])) if b]
    return dict(found[0]) if found else None


def mark_namespace(namespace: str, policies: kopf.Index[Any, Any],
                   logger: logging.Logger) -> int:
    """Set Conflicting where it is not right on the policies of `namespace`
    due a look; returns how many it wrote. Raises the first failure after
    trying every one, leaving the failed ones due."""
    with _lock:
        due = _due.pop(namespace, set())
    failed: Exception | None = None
    written = 0
    for name in sorted(due):
        body = _body(namespace, name, policies)
        if body is None:
            continue  # deleted: its DELETED event updated the others
        overlap = first_overlap(namespace, name, policies)
        try:
            if _write(namespace, body, overlap):
                written += 1
                if overlap is not None:
                    logger.warning("policy %s/%s: %s", namespace, name,
                                   conflicts.message(overlap))
        except (kube.ApiException, RuntimeError) as error:
            failed = failed or error
            with _lock:
                _due.setdefault(namespace, set()).add(name)
    if failed is not None:
        raise failed
    return written


@kopf.on.event(*POLICIES)
def checkpointpolicy_conflicts(namespace: str, body: kopf.Body, event: kopf.RawEvent,
                               logger: logging.Logger,
                               checkpointpolicy_index: kopf.Index[Any, Any],
                               **_: Any) -> None:
    """A policy came, changed or went: if its selector or deletion mark
    changed (or its own condition is not what the graph says), mark the
    policies concerned soon."""
    deleted = (event or {}).get("type") == "DELETED"
    if observe(namespace, policy_edge.seen(body), deleted):
        _passes.schedule(namespace,
                         lambda: mark_namespace(namespace, checkpointpolicy_index, logger),
                         logger, PASS_DELAY_S)
