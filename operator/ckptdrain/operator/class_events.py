"""CheckpointClass changes reach the policies they decide for.

A policy is reconciled when its own spec changes; a class created, changed
or deleted changes what its policies may do without touching them. On each
class event the operator judges every policy's class again
(policy/classes.py) and reconciles, as its handler does, each policy whose
ClassResolved condition would change: a policy whose class was deleted
turns Invalid with ClassResolved False (its pods are then refused or
admitted bare at admission, as for any invalid policy), and back when the
class returns.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from ckptdrain.contract import api
from ckptdrain.operator import handlers
from ckptdrain.operator.apiserver import class_view, kube
from ckptdrain.operator.bandwidth import rebalance
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import status as st

CLASSES = (api.GROUP, "v1beta1", "checkpointclasses")
INDEXES = ("pod_index", "checkpointpolicy_index", "checkpoint_index", "peer_pod_index",
           "progress_index")


def stale(cfg: OperatorConfig, body: dict[str, Any]) -> bool:
    """The policy's ClassResolved condition is not what its class says now.
    A policy without one has not been reconciled by this operator yet: its
    own handler (create, resume) judges its class then, so the classes
    listed at start do not reconcile every policy once more."""
    have = next((c for c in (body.get("status") or {}).get("conditions") or []
                 if c.get("type") == st.CLASS_RESOLVED), None)
    if have is None:
        return False
    want = rebalance.class_condition(cfg, body)
    return any(have.get(k) != want[k] for k in ("status", "reason", "message"))


@kopf.on.event(*CLASSES)
def checkpointclass_event(event: kopf.RawEvent, memo: kopf.Memo, logger: logging.Logger,
                          **kwargs: Any) -> None:
    # This event may reach Kopf before the process's own watch of classes:
    # the view takes it now, so the judgement below sees the change.
    class_view.CLASSES.apply(str(event.get("type") or "ADDED"), dict(event["object"]))
    cfg: OperatorConfig = memo.config
    index: kopf.Index[Any, Any] = kwargs["checkpointpolicy_index"]
    for key in list(index):
        body = next((b for b in index.get(key, []) if b is not None), None)
        if body is None or not stale(cfg, body):
            continue
        patch = kopf.Patch()
        handlers.reconcile_policy(body=kopf.Body(body), patch=patch, memo=memo, logger=logger,
                                  announce=False, **{k: kwargs[k] for k in INDEXES})
        status = patch.get("status")
        if status:
            logger.info("policy %s/%s: its class changed; status reconciled", *key)
            kube.patch_status(api.POLICIES, key[0], key[1], dict(status))
