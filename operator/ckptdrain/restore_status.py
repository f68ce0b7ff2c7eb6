"""What the pods' restores tell the policy status beside goodput: the ranks'
newest restore agreement (`status.lastRestoreAgreement`) and the newest
failed restore (`status.lastRestoreFailure`). Pure: read from the pods'
`ckptdrain.io/restore-result` views (contract/goodput.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ckptdrain.contract.goodput import PodView


def restore_agreement(pods: Iterable[PodView]) -> dict[str, Any] | None:
    """The newest decision the ranks agreed on (highest round), for the policy
    status: which step, why, and how many pods reported restoring it."""
    rounds = [p.restore for p in pods if p.restore is not None and p.restore.agreement]
    if not rounds:
        return None
    newest = max(r.agreement[0] for r in rounds if r.agreement)  # type: ignore[index]
    these = [r for r in rounds if r.agreement and r.agreement[0] == newest]
    round_, step, why, detail = these[0].agreement  # type: ignore[misc]
    return {"round": round_, "step": step, "why": why, "detail": detail,
            "pods": len(these), "startedAt": round(min(r.started_at for r in these), 3)}


def restore_failure(pods: Iterable[PodView]) -> dict[str, Any] | None:
    """The newest failed restore among `pods`, for the policy status."""
    failed = [p for p in pods if p.restore is not None and p.restore.failed]
    if not failed:
        return None
    p = max(failed, key=lambda p: p.restore.started_at)  # type: ignore[union-attr]
    r = p.restore
    assert r is not None
    return {"pod": p.name, "writer": p.writer, "outcome": r.outcome, "reason": r.reason,
            "startedAt": round(r.started_at, 3), "attempts": r.attempts,
            **({} if p.reader is None else {"reader": p.reader})}
