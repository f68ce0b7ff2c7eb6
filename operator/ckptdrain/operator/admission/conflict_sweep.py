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

It runs on every policy event (coalesced per namespace), status changes
included: a sizing patch written from an older status could drop the
condition, and the next pass puts it back. Kopf runs event handlers on the
active replica only.
"""

from __future__ import annotations

import logging
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

_passes = Coalescer("marking overlapping policies")


def mark_namespace(namespace: str, policies: kopf.Index[Any, Any],
                   logger: logging.Logger) -> int:
    """Set Conflicting on the policies of `namespace` where it changed;
    returns how many overlap another."""
    bodies = [b for key in list(policies) if key[0] == namespace
              for b in policies.get(key, []) if b]
    found = conflicts.find(bodies)
    now = datetime.now(UTC)
    for body in bodies:
        meta = body["metadata"]
        overlap = found.get(meta["name"])
        change = conflicts.with_conflict(body.get("status") or {}, overlap,
                                         meta.get("generation"), now)
        if change is not None:
            kube.patch_status(api.POLICIES, namespace, meta["name"], change)
            if overlap is not None:
                logger.warning("policy %s/%s: %s", namespace, meta["name"],
                               conflicts.message(overlap))
    return sum(1 for o in found.values() if o is not None)


def _mark_logged(namespace: str, policies: kopf.Index[Any, Any],
                 logger: logging.Logger) -> None:
    try:
        mark_namespace(namespace, policies, logger)
    except (kube.ApiException, RuntimeError) as error:
        # RuntimeError: the index changed while we read it; the next event retries.
        logger.warning("marking overlapping policies in %s failed (%s)", namespace, error)


@kopf.on.event(*POLICIES)
def checkpointpolicy_conflicts(namespace: str, logger: logging.Logger,
                               checkpointpolicy_index: kopf.Index[Any, Any],
                               **_: Any) -> None:
    """A policy came, changed or went: look at its namespace's overlaps soon."""
    _passes.schedule(namespace, lambda: _mark_logged(namespace, checkpointpolicy_index, logger),
                     logger, PASS_DELAY_S)
