"""Admission's side of the node-directory rule (policy/node_dirs.py, hostPath
mode): the other namespaces' policies it judges against, read from a current
view or the apiserver, and the pod refusal. Policy admission refuses a
policy whose node directory would nest with another namespace's
(policy_rules.py); pod admission refuses a pod of such a policy when it is
the newer of the two (stored before the rule, or two created at once on two
replicas), so the older tenant's pods keep working."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from ckptdrain.operator.admission.refusal import READ_ERRORS, Refused
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import node_dirs
from ckptdrain.operator.policy import spec as pol


async def every_policy(cfg: OperatorConfig, every: list[dict[str, Any]] | None,
                       timeout: float | None, field: str) -> list[dict[str, Any]]:
    """`every` when given, else the policies of all watched namespaces read
    from the apiserver (within `timeout`; None: the admission reads' own);
    refuses (503, retry) naming `field` when they cannot be read: the node
    directory check fails closed."""
    if every is not None:
        return every
    try:
        if timeout is None:
            return await asyncio.to_thread(apiserver_reads.list_policies, cfg.namespace)
        return await asyncio.to_thread(apiserver_reads.list_policies, cfg.namespace, timeout)
    except READ_ERRORS as error:
        raise Refused(f"{field}: could not read the other namespaces' CheckpointPolicies to "
                      f"check that node directories do not nest ({error}); retry",
                      code=503) from None


async def refuse_pod(p: pol.Policy, namespace: str, chosen: Mapping[str, Any],
                     cfg: OperatorConfig, every: list[dict[str, Any]] | None,
                     logger: logging.Logger) -> None:
    """Refuse a pod whose policy `chosen` has a node directory nesting with
    an older (or as old) policy's of another namespace."""
    others = await every_policy(cfg, every, None, node_dirs.FIELD)
    created = str((chosen.get("metadata") or {}).get("creationTimestamp") or "") or None
    clash = node_dirs.first_clash(namespace, p.local_path, others, created)
    if clash is not None:
        logger.warning("pod of policy %s refused: its node directory nests with %s/%s's %s",
                       p.key, clash.namespace, clash.policy, clash.directory)
        raise Refused(node_dirs.pod_refusal(p.name, namespace, p.local_path), code=403)
