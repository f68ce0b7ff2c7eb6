"""Admission of a CheckpointPolicy (CREATE and UPDATE), shared by the
admission process (admission/process.py) and Kopf's server
(admission/webhook.py). Three refusals, in order:

1. a spec the operator cannot honour (admission/rules.py validate_policy);
2. a selector that can pick a pod another policy of the namespace also
   picks (policy/conflicts.py): such a pod could never be injected, so the
   policy is refused with one label set both would pick;
3. an UPDATE that changes where checkpoints live (`spec.storage.uri`,
   `spec.localTier.path`) or `spec.writers` while pods the policy injected
   live (policy/relocation.py): refused naming one, with the way to move.

The other policies and the live pods are read from the apiserver, not a
watched view: policies are written rarely, and a view could miss a policy
created a moment ago, which is the very race (two creates at once) this
check exists for. A read that fails refuses (503): the policy webhook fails
closed. What still slips through (the webhook down, two creates at the
same instant) pod admission refuses pod by pod.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ckptdrain.operator.admission.rules import Refused, validate_policy
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import conflicts, relocation


def moves_refused(name: str, fields: list[str], pod: str) -> str:
    """The message for an UPDATE changing guarded `fields` while `pod` lives."""
    ways = []
    if relocation.WRITERS_FIELD in fields:
        ways.append("to change spec.writers, suspend the job (its pods end), change the "
                    "policy, then resume: restore hands the newest step to the new writers "
                    "to reshard")
    if any(f != relocation.WRITERS_FIELD for f in fields):
        ways.append("to move checkpoints, create a new policy for the new location, or set "
                    "spec.relocation.reason (a new text) in the same update to say the pods "
                    "of this policy will restore from the new location (from step 0 if "
                    "nothing is there)")
    return (f"{', '.join(fields)}: cannot change while pods of policy {name} live "
            f"(pod {pod}); {'; '.join(ways)}")


async def admit_policy(body: Mapping[str, Any], old: Mapping[str, Any] | None,
                       namespace: str, cfg: OperatorConfig) -> None:
    """Refuse (Refused) a policy CREATE or UPDATE (`old`: the stored object)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    name = str(meta.get("name") or "")
    namespace = namespace or str(meta.get("namespace") or "")
    validate_policy(spec, name, cfg)
    old_spec = (old or {}).get("spec")
    old_spec = old_spec if isinstance(old_spec, Mapping) else None
    selector = spec.get("selector")
    if old_spec is None or old_spec.get("selector") != selector:
        await _refuse_overlap(name, namespace, selector if isinstance(selector, Mapping) else {})
    if old_spec is not None:
        await _refuse_moves(name, namespace, old_spec, spec)


async def _refuse_overlap(name: str, namespace: str, selector: Mapping[str, Any]) -> None:
    try:
        others = await asyncio.to_thread(apiserver_reads.list_policies, namespace)
    except (apiserver_reads.ApiError, apiserver_reads.HTTPError, OSError) as error:
        raise Refused(f"spec.selector: could not read the other CheckpointPolicies of "
                      f"{namespace} to check for overlap ({error}); retry", code=503) from None
    found = conflicts.first_overlap(name, selector, others)
    if found is not None:
        other, witness = found
        raise Refused(
            f"spec.selector: overlaps CheckpointPolicy {other} in {namespace}: a pod labelled "
            f"{conflicts.labels_text(witness)} would be selected by both, and a pod two "
            "policies select cannot be injected; make the selectors exclusive (e.g. a "
            "label one requires and the other excludes with NotIn)", code=409)


async def _refuse_moves(name: str, namespace: str, old: Mapping[str, Any],
                        new: Mapping[str, Any]) -> None:
    fields = relocation.refused(old, new)
    if not fields:
        return
    try:
        live = await asyncio.to_thread(apiserver_reads.live_injected_pods, namespace, name)
    except (apiserver_reads.ApiError, apiserver_reads.HTTPError, OSError) as error:
        raise Refused(f"{', '.join(fields)}: could not check for live pods of policy {name} "
                      f"({error}); retry", code=503) from None
    if live:
        raise Refused(moves_refused(name, fields, live[0]), code=409)
