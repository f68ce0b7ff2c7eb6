"""What restore tells the cluster about itself, on its own pod. Pure.

- `ckptdrain.io/restored-from` (success only): `step=<N> tier=<tier>` or `fresh`;
- `ckptdrain.io/restore-result` (always): contract/goodput.RestoreView as JSON, so
  the operator can time the recovery and put a failure's reason in the
  policy status.
"""

from __future__ import annotations

from ckptdrain.contract.api import (
    ANNOTATION_RESTORE_RESULT,
    ANNOTATION_RESTORED,
    restored_from,
)
from ckptdrain.contract.goodput import RestoreView
from ckptdrain.restore.result import RestoreResult


def _agreement(result: RestoreResult) -> tuple[int, int | None, str, str] | None:
    a = result.agreement
    if not a or not isinstance(a.get("round"), int):
        return None
    step = a.get("step")
    return (int(a["round"]), step if isinstance(step, int) else None,  # type: ignore[arg-type]
            str(a.get("why", "")), str(a.get("detail", "")))


def pod_annotations(result: RestoreResult, code: int, now: float) -> dict[str, str]:
    """The annotations for a restore that ended at `now` with exit code `code`."""
    view = RestoreView(outcome=result.outcome, started_at=round(now - result.seconds, 3),
                       seconds=result.seconds, step=result.step, tier=result.tier,
                       reason=result.reason, attempts=result.attempts,
                       step_created=result.step_created, agreement=_agreement(result))
    out = {ANNOTATION_RESTORE_RESULT: view.to_json()}
    if code == 0:
        out[ANNOTATION_RESTORED] = restored_from(result.step, result.tier)
    return out
