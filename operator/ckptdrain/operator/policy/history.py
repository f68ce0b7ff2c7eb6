"""Where a policy's checkpoints were: `status.storage`, so that a move of
`spec.storage.uri` can never turn into a silent restart from step 0. Pure:
the clock is passed in.

    status:
      lastGlobalStep: 4200           # the records' newest complete step
      storage:
        uri: s3://new/ml/llama       # the prefix pods are given now
        earlier:                     # newest first, at most 5
        - {uri: s3://old/ml/llama, lastGlobalStep: 4200,
           movedAt: "2026-11-29T10:00:00Z", reason: bucket migration}

`storage_status(status, policy, now)` is what each reconcile writes: the
current prefix and, when it differs from the one recorded before and
checkpoints completed there, the earlier one with its newest step. The
webhook tells restore the same list (`told_to_restore`), computed from the
status as it is, so a pod admitted between a move and the reconcile that
records it is told too.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ckptdrain.contract.api import timestamp
from ckptdrain.contract.earlier_stores import MAX_EARLIER, EarlierStore
from ckptdrain.operator.policy.spec import Policy


def _step(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _entries(value: Any) -> list[dict[str, Any]]:
    """The well-formed entries of a stored `earlier` list (a hand-edited
    status may hold anything)."""
    if not isinstance(value, list):
        return []
    return [dict(e) for e in value if isinstance(e, Mapping) and isinstance(e.get("uri"), str)
            and e.get("uri") and _step(e.get("lastGlobalStep")) is not None]


def storage_status(status: Mapping[str, Any], policy: Policy,
                   now: datetime) -> dict[str, Any]:
    """`status.storage` as it should read now.

    A move is remembered when the status recorded another prefix before and
    says a checkpoint completed globally (`lastGlobalStep`) since the newest
    move it remembers: the records outlive a move, so a prefix left before
    any checkpoint reached it still shows the step of the one before, which
    stays the place to copy from. A move back to a remembered prefix drops
    it (its checkpoints are where pods now look). A status without a prefix
    (a new policy, or one from before this field) just records the current one.
    """
    prefix = policy.store_prefix()
    before = status.get("storage")
    before = before if isinstance(before, Mapping) else {}
    recorded = before.get("uri")
    earlier = _entries(before.get("earlier"))
    step = _step(status.get("lastGlobalStep"))
    reached = step is not None and not (earlier and earlier[0]["lastGlobalStep"] == step)
    if isinstance(recorded, str) and recorded and recorded != prefix and reached:
        entry: dict[str, Any] = {"uri": recorded, "lastGlobalStep": step,
                                 "movedAt": timestamp(now)}
        if policy.relocation_reason:
            entry["reason"] = policy.relocation_reason
        earlier.insert(0, entry)
    kept = [e for e in earlier if e["uri"] != prefix]
    return {"uri": prefix, "earlier": kept[:MAX_EARLIER]}


def told_to_restore(status: Mapping[str, Any], policy: Policy,
                    now: datetime) -> list[EarlierStore]:
    """The earlier prefixes a pod's restore is given, newest first; none with
    `spec.relocation.startFresh`, which asks for step 0 at the new prefix."""
    if policy.start_fresh:
        return []
    return [EarlierStore(e["uri"], e["lastGlobalStep"], str(e.get("movedAt") or ""),
                         str(e.get("reason") or ""))
            for e in storage_status(status, policy, now)["earlier"]]
