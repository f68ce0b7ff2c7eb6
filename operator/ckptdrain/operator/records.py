"""Checkpoint records, the operator's side: the aggregate of the writers' claims,
retention of complete records, and the recovery point. Pure.

The record format and each writer's claim are the contract (contract/record.py);
agents write their claims through node/kube.RecordWriter.

Completion trusts the agents' claims: an agent reports `Global` for its shard
only after its manifest is written and verified in the store; the operator
marks the checkpoint Global (complete) when every expected writer has done so.
The operator holds no store credentials, by design.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ckptdrain import retention, units
from ckptdrain.contract.api import timestamp
from ckptdrain.contract.record import owner_reference

_RANK = {"Capturing": 0, "Local": 1, "Draining": 2, "Retrying": 2, "Global": 3}


def owner_patch(record: Mapping[str, Any], policy_uid: str | None) -> dict[str, Any] | None:
    """Metadata patch adding the policy as owner (agents don't know its uid); None if set."""
    meta = record.get("metadata", {})
    if not policy_uid or any(r.get("uid") == policy_uid for r in meta.get("ownerReferences")
                             or []):
        return None
    ref = owner_reference(record.get("spec", {}).get("policy", ""), policy_uid)
    return {"metadata": {"ownerReferences": [*(meta.get("ownerReferences") or []), ref]}}


@dataclass(frozen=True)
class Summary:
    state: str
    size_bytes: int
    tiers: str
    writers: str
    complete: bool


def summarize(record: Mapping[str, Any]) -> Summary:
    """The aggregate of every writer's claim."""
    spec = record.get("spec", {})
    status = record.get("status") or {}
    expected = int(spec.get("writers", 1))
    claims = list((status.get("writers") or {}).values())
    size = sum(int(c.get("bytes", 0)) for c in claims)
    done = sum(1 for c in claims if c.get("state") == "Global")
    if status.get("state") == "Expired":
        state = "Expired"
    elif any(c.get("state") == "Failed" for c in claims):
        state = "Failed"
    elif done >= expected:
        state = "Global"
    elif any(c.get("state") == "Retrying" for c in claims):
        state = "Retrying"
    elif not claims:
        state = "Capturing"
    elif len(claims) >= expected and all(_RANK.get(c.get("state", ""), 0) >= 1 for c in claims):
        state = "Draining" if any(_RANK.get(c.get("state", ""), 0) >= 2 for c in claims) \
            else "Local"
    else:
        state = "Draining" if any(_RANK.get(c.get("state", ""), 0) >= 2 for c in claims) \
            else "Capturing"
    tiers = sorted({t for c in claims for t in c.get("tiers", [])} - (
        set() if done >= expected else {"global"}))
    return Summary(state=state, size_bytes=size, tiers=",".join(tiers) or "-",
                   writers=f"{len(claims)}/{expected}", complete=done >= expected)


def aggregate_patch(record: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """Status fields the operator writes; {} when nothing changes."""
    s = summarize(record)
    status = record.get("status") or {}
    wanted: dict[str, Any] = {"state": s.state, "sizeBytes": s.size_bytes,
                              "size": units.format_bytes(s.size_bytes), "tiers": s.tiers,
                              "writersReady": s.writers}
    if s.complete and not status.get("completionTime"):
        wanted["completionTime"] = timestamp(now)
    changed = {k: v for k, v in wanted.items() if status.get(k) != v}
    return changed


def to_expire(records: Iterable[Mapping[str, Any]], keep: int) -> list[str]:
    """Names of complete records beyond the newest `keep`; never the newest complete
    (retention.complete_expired), newest first."""
    complete = {int(r["spec"]["step"]): r["metadata"]["name"] for r in records
                if summarize(r).state == "Global"}
    return [complete[step] for step in retention.complete_expired(complete, keep)]


def latest_steps(records: Iterable[Mapping[str, Any]]
                 ) -> tuple[int | None, int | None, str | None]:
    """(newest step on a local tier, newest complete global step, its completion time)."""
    local = glob = None
    when = None
    for r in records:
        s = summarize(r)
        step = int(r["spec"]["step"])
        if s.state in ("Local", "Draining", "Global") and (local is None or step > local):
            local = step
        if s.state == "Global" and (glob is None or step > glob):
            glob, when = step, (r.get("status") or {}).get("completionTime")
    return local, glob, when
