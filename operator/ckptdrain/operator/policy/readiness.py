"""The pod census's part of a policy's status: `status.pods` (how many
selected pods are protected, starting, waiting, unprotected:
admission/protection.py counts them, and the generation whose selector they
were counted under) and Ready's verdict on them. Pure: the clock is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ckptdrain.operator.policy import status as st


def pods_field(counts: Mapping[str, int], generation: int | None) -> dict[str, Any]:
    """`status.pods`: the counts, and the generation they were counted under."""
    return {**counts, "observedGeneration": generation}


def with_pods(current: Mapping[str, Any], counts: Mapping[str, int],
              unprotected: Sequence[str], generation: int | None,
              now: datetime) -> dict[str, Any] | None:
    """Status patch from the pod census: `pods` (the counts), and Ready and
    the phase when the pods' verdict changed; None when nothing changes. An
    invalid or not yet sized policy gets the counts only: its Ready is the
    sizing pass's."""
    patch: dict[str, Any] = {}
    pods = pods_field(counts, generation)
    if current.get("pods") != pods:
        patch["pods"] = pods
    conditions = list(current.get("conditions") or [])
    before = next((c for c in conditions if c.get("type") == st.READY), None)
    if before is None or before.get("reason") == st.INVALID or current.get("phase") == "Invalid":
        return patch or None
    sizing = before.get("message", "") if before.get("status") == "True" \
        else st.sizing_summary(current)
    new = st.ready(sizing, unprotected, counts.get("selected", 0), generation, now, conditions)
    keys = ("status", "reason", "message") + (
        ("observedGeneration",) if new["status"] == "False" else ())
    if any(before.get(k) != new[k] for k in keys):
        kept = [new if c.get("type") == st.READY else c for c in conditions]
        patch.update(conditions=kept, phase=st.phase(kept))
    return patch or None


def needs_count(body: Mapping[str, Any]) -> bool:
    """Whether a policy's event calls for a census pass now rather than at the
    next period: never counted, its pods were counted under another
    generation (a new selector), whatever Ready says, or its Ready disagrees
    with its counts."""
    status = body.get("status") or {}
    pods = status.get("pods")
    if not isinstance(pods, Mapping):
        return True
    before = next((c for c in status.get("conditions") or [] if c.get("type") == st.READY),
                  None)
    if before is None or before.get("reason") == st.INVALID:
        return False  # an invalid spec's Ready is the sizing pass's alone
    if pods.get("observedGeneration") != (body.get("metadata") or {}).get("generation"):
        return True
    unprotected = bool(pods.get("unprotected"))
    return unprotected == (before.get("status") == "True")
