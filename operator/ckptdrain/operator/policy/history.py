"""Where a policy's checkpoints were: `status.storage`, so that a move of
`spec.storage.uri` can never turn into a silent restart from step 0. Pure:
the clock is passed in.

    status:
      storage:
        uri: s3://new/ml/llama        # the prefix pods are given now
        since: "2026-11-29T10:00:00Z" # when it became the current one
        reason: bucket migration      # spec.relocation.reason at the last move
        startFresh: false             # spec.relocation.startFresh as last seen
        earlier:                      # newest first, at most 5
        - {uri: s3://old/ml/llama, lastGlobalStep: 4200,
           movedAt: "2026-11-29T10:00:00Z", reason: bucket migration}

`storage_status(body, policy, now, completed)` is what each reconcile
writes. At a move the prefix left is remembered when a checkpoint completed
globally there, with the newest such step. What a prefix reached comes from
the policy's Checkpoint records (`completed()`, asked at a move only: each
complete record's step and completion time), those that completed after
`since`: the records outlive a move and the old run's newest is never
expired, so neither `status.lastGlobalStep` nor the step numbers say where
a step was saved.

A fresh start is acknowledged for one move only: the update that sets
`spec.relocation.startFresh` (it was not set at the reconcile before)
together with a `spec.relocation.reason` other than the one recorded
waives the newest entry (`startFresh: true` on it), and with it every older
one. Restore is told the entries newer than the newest waived one
(`told_to_restore`). The webhook computes them from the status as it is, so
a pod admitted between a move and the reconcile that records it is told
too; it has no records, and reads what the status says of them instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from ckptdrain.contract.api import parse_timestamp, timestamp
from ckptdrain.contract.earlier_stores import MAX_EARLIER, EarlierStore
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.policy.spec import Policy
from ckptdrain.store import parse_store_uri

#: The longest uri and reason an entry keeps (the CRD bounds a reason the
#: same way), so the five told to restore stay far below its 64 KiB.
MAX_URI, MAX_REASON = 2048, 1024


def _step(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _time(value: Any) -> datetime | None:
    try:
        return parse_timestamp(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _uri(value: Any) -> str | None:
    """A prefix as a store reads it, or None: a hand-edited status must not
    hand restore anything else."""
    if not isinstance(value, str) or len(value) > MAX_URI:
        return None
    try:
        parse_store_uri(value)
    except InvalidInput:
        return None
    return value


def _reason(value: Any) -> str:
    """A reason on one line (restore quotes it in a one-line message)."""
    if not isinstance(value, str):
        return ""
    return "".join(c if c.isprintable() else " " for c in value[:MAX_REASON])


def _entries(value: Any) -> list[dict[str, Any]]:
    """The well-formed entries of a stored `earlier` list, with only the
    fields this module writes (a hand-edited status may hold anything)."""
    out: list[dict[str, Any]] = []
    for e in value if isinstance(value, list) else ():
        if not isinstance(e, Mapping) or _uri(e.get("uri")) is None \
                or _step(e.get("lastGlobalStep")) is None:
            continue
        entry: dict[str, Any] = {"uri": e["uri"], "lastGlobalStep": e["lastGlobalStep"]}
        if _time(e.get("movedAt")) is not None:
            entry["movedAt"] = e["movedAt"]
        if _reason(e.get("reason")):
            entry["reason"] = _reason(e.get("reason"))
        if e.get("startFresh") is True:
            entry["startFresh"] = True
        out.append(entry)
    return out


def _reached(body: Mapping[str, Any], before: Mapping[str, Any],
             earlier: list[dict[str, Any]],
             completed: Iterable[tuple[int, str]] | None) -> int | None:
    """The newest step that completed globally at the recorded prefix, None
    when none did. Without records (the webhook), what the status says of
    them: the newest global step, when it completed after `since`."""
    status = body.get("status") or {}
    since = _time(before.get("since"))
    if completed is None:
        completed = [(status.get("lastGlobalStep"), status.get("recoveryPointTime"))]
    # After a move's `since`, not in its second (times are whole seconds):
    # the pods of the prefix before may complete a step in the moment of the
    # move, never a pod of the new prefix, which had still to start and save.
    # Since the policy's creation, everything: there was no prefix before.
    first = since is not None and before.get("since") == (
        body.get("metadata") or {}).get("creationTimestamp")
    steps = [s for s, when in completed if _step(s) is not None and (
        since is None or ((t := _time(when)) is not None
                          and (t >= since if first else t > since)))]
    step = max(steps, default=None)
    if since is None and earlier and earlier[0]["lastGlobalStep"] == step:
        # A status from before `since`: a prefix left before any checkpoint
        # reached it shows the step of the one before, still the place to copy from.
        return None
    return step


def storage_status(body: Mapping[str, Any], policy: Policy, now: datetime,
                   completed: Callable[[], Iterable[tuple[int, str]]] | None = None
                   ) -> dict[str, Any]:
    """`status.storage` as it should read now, for the policy object `body`
    (its status and creation time). `completed()`: (step, completionTime) of
    the policy's complete Checkpoint records, asked only at a move; None
    where they are not at hand (the webhook). A move back to a remembered
    prefix drops it (its checkpoints are where pods now look)."""
    status = body.get("status") or {}
    before = status.get("storage") if isinstance(status.get("storage"), Mapping) else {}
    prefix = policy.store_prefix()
    recorded = _uri(before.get("uri"))
    earlier = _entries(before.get("earlier"))
    # A status from before `reason`: the newest move's is the one recorded.
    last_reason = _reason(before.get("reason") if "reason" in before
                          else earlier[0].get("reason") if earlier else "")
    reason = _reason(policy.relocation_reason)
    new_reason = bool(reason) and reason != last_reason
    since: Any = before.get("since") if _time(before.get("since")) else None
    if recorded is None:  # a new policy, or one from before this field
        created = (body.get("metadata") or {}).get("creationTimestamp")
        since = created if _time(created) else timestamp(now)
    elif recorded != prefix:
        step = _reached(body, before, earlier, None if completed is None else completed())
        if step is not None:
            entry: dict[str, Any] = {"uri": recorded, "lastGlobalStep": step,
                                     "movedAt": timestamp(now)}
            if new_reason:  # a reason left from an earlier move is not this one's
                entry["reason"] = reason
            earlier.insert(0, entry)
        since = timestamp(now)
    kept = [e for e in earlier if e["uri"] != prefix][:MAX_EARLIER]
    waived = policy.start_fresh and new_reason and before.get("startFresh") is not True
    if waived and kept:
        kept[0]["startFresh"] = True
    if new_reason and (recorded != prefix or waived):
        last_reason = reason
    return {"uri": prefix, "since": since, "reason": last_reason,
            "startFresh": policy.start_fresh, "earlier": kept}


def told_to_restore(body: Mapping[str, Any], policy: Policy,
                    now: datetime) -> list[EarlierStore]:
    """The earlier prefixes a pod's restore is given, newest first: those a
    fresh start did not waive (module docstring)."""
    entries = storage_status(body, policy, now)["earlier"]
    return [EarlierStore(e["uri"], e["lastGlobalStep"], str(e.get("movedAt") or ""),
                         str(e.get("reason") or ""))
            for e in itertools.takewhile(lambda e: not e.get("startFresh"), entries)]
