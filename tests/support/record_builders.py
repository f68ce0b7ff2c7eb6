"""CheckpointRecords as the operator's tests build them: in the shape agents
from before the progress annotation left them (`record`), or folded from the
writers' progress (`folded`), checking that a second fold writes nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ckptdrain.contract import record as fmt
from ckptdrain.contract.progress import Claim
from ckptdrain.operator.records import aggregate as records

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def record(step: int, claims: dict[str, str], writers: int = 2,
           state: str | None = None) -> dict[str, Any]:
    """A record as agents from before the progress annotation left it: one
    claim per writer in status.writers, keyed by the writer's rank."""
    r = fmt.build_record("ns", "pol", step, writers)
    r["status"] = {"writers": {w: fmt.writer_patch(w, s, 100, ["local", "global"]
                                                       if s == "Global" else ["local"], NOW)
                               ["status"]["writers"][w] for w, s in claims.items()}}
    if state:
        r["status"]["state"] = state
    return r


def claim(state: str, size: int = 100, **kw: Any) -> Claim:
    tiers = {"Capturing": ()}.get(state, ("global", "local") if state == "Global"
                                  else ("local",))
    return Claim(state=state, bytes=size, tiers=kw.pop("tiers", tiers),
                 at="2026-01-02T03:04:05Z", **kw)


def applied(rec: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """The record after the operator's merge patch of its status (a null
    removes the key: that is how a state's rank range goes away)."""
    status = dict(rec.get("status") or {})
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(status.get(key), dict):
            merged = {**status[key], **value}
            status[key] = {k: v for k, v in merged.items() if v is not None}
        elif isinstance(value, dict):
            status[key] = {k: v for k, v in value.items() if v is not None}
        elif value is None:
            status.pop(key, None)
        else:
            status[key] = value
    return {**rec, "status": status}


def folded(rec: dict[str, Any], claims: dict[int, Claim],
           now: datetime = NOW) -> dict[str, Any]:
    """Fold, apply, and check that folding the same claims again changes
    nothing (the operator's own write comes back to it as an event)."""
    after = applied(rec, records.fold(rec, claims, now))
    assert records.fold(after, claims, now) == {}, "a second fold of the same claims wrote"
    return after


def new_record(step: int = 5, writers: int = 2) -> dict[str, Any]:
    return fmt.build_record("ns", "pol", step, writers)
