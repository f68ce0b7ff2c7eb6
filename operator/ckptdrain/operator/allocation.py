"""Who drains how fast: per-pod bandwidth shares. Pure.

Each policy's allowed bandwidth (its sizing, already bounded by its own cap)
is split among its active drainers in proportion to the bytes each reports
pending, evenly where unknown (`sizing.split_shares`). When the policies of
the whole cluster together want more than the cluster cap, every policy's
budget is scaled down by the same factor, so no workload starves another.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ckptdrain import sizing

#: A share may grow by up to this fraction before the pod is rewritten, so tiny
#: changes in pending bytes do not rewrite every pod. Decreases are always
#: written: the sum of the shares must never exceed the budget (a cap).
DEFAULT_TOLERANCE = 0.02


@dataclass(frozen=True)
class DrainingPod:
    """An injected pod as allocation sees it: what it has pending and its share now.
    (transfer.drain.Drainer is the upload engine; this is a pod's share record.)"""

    pod: str
    pending_bytes: float | None
    current_share: int | None
    #: The pod's creationTimestamp (for the stall watchdog; not used to split).
    created: str | None = None
    #: Its writer rank (label ckptdrain.io/writer) and the writer count its
    #: workload gave at admission (status.writers_check; not used to split).
    writer: str | None = None
    workload_writers: int | None = None


def parse_annotation_number(text: object) -> float | None:
    """A non-negative number from an annotation, or None if absent or malformed."""
    if not isinstance(text, str):
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def policy_budgets(wanted: Mapping[str, float], cluster_cap: float | None) -> dict[str, float]:
    """Each policy's budget: what it wants, scaled down together to fit the cluster cap."""
    total = sum(wanted.values())
    if cluster_cap is None or total <= cluster_cap or total <= 0:
        return dict(wanted)
    factor = cluster_cap / total
    return {key: value * factor for key, value in wanted.items()}


def shares(budget: float, drainers: list[DrainingPod],
           per_drainer_cap: float | None = None) -> dict[str, int]:
    """Whole bytes/s per pod; every active pod gets at least 1."""
    if not drainers or budget <= 0:
        return {}
    raw = sizing.split_shares(budget, {d.pod: d.pending_bytes for d in drainers},
                              per_drainer_cap)
    return {pod: max(1, int(value)) for pod, value in raw.items()}


def changes(drainers: list[DrainingPod], wanted: Mapping[str, int],
            tolerance: float = DEFAULT_TOLERANCE) -> dict[str, int]:
    """The pods whose annotation must be rewritten, and to what: every decrease
    (so the budget is never exceeded), and increases beyond `tolerance`."""
    out: dict[str, int] = {}
    for d in drainers:
        target = wanted.get(d.pod)
        if target is None:
            continue
        current = d.current_share
        if current is None or target < current or target > current * (1 + tolerance):
            out[d.pod] = target
    return out
