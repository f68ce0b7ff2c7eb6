"""How much each policy may drain at. Pure.

Each policy's allowed bandwidth is its sizing, already bounded by its own
cap. When the policies of the whole cluster together want more than the
cluster cap, every policy's budget is scaled down by the same factor, so no
workload starves another. (How a policy's budget is split among its drainers
is the share channel's: contract/share.py, operator/bandwidth/share_channel.py.)
Each policy's sizing and status are then built from that joint budget
(`joint_sizing`), never from the policy alone against the cluster cap.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from ckptdrain import sizing
from ckptdrain.errors import InvalidInput

K = TypeVar("K", bound=Hashable)

@dataclass(frozen=True)
class DrainingPod:
    """An injected pod as the operator indexes it: what it reported pending.
    (transfer.drain.Drainer is the upload engine; this is a pod's record.)"""

    pod: str
    pending_bytes: float | None
    #: The pod's creationTimestamp (for the stall watchdog; not used to split).
    created: str | None = None
    #: Its writer rank (label ckptdrain.io/writer) and the writer count its
    #: workload gave at admission (status.writers_check; not used to split).
    writer: str | None = None
    workload_writers: int | None = None
    #: Being deleted (it may still flush; admission does not count it as live).
    deleting: bool = False
    #: Its agent said it applies the namespace's cluster scale (annotation
    #: ckptdrain.io/share-scale); an older agent reads only its channel's budget.
    follows_scale: bool = False


def parse_annotation_number(text: object) -> float | None:
    """A non-negative number from an annotation, or None if absent or malformed."""
    if not isinstance(text, str):
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


@dataclass(frozen=True)
class ClusterShare:
    """One policy's part of the cluster cap, as jointly applied to every policy."""

    #: Bytes/s the policy may drain at: what it wanted, scaled with the others.
    budget: float
    #: What it wanted alone (its sizing, bounded by its own cap only).
    wanted: float
    #: What every valid policy wanted together, and how many there were.
    total_wanted: float
    policies: int
    cluster_cap: float | None

    @property
    def factor(self) -> float:
        """By how much every policy's budget is scaled down together (1: not at all)."""
        return scale_factor(self.total_wanted, self.cluster_cap)

    @property
    def scaled(self) -> bool:
        """The cluster cap bound jointly: this policy gets less than it wanted."""
        return self.budget < self.wanted


def scale_factor(total_wanted: float, cluster_cap: float | None) -> float:
    """The one factor every policy's budget is scaled by so the sum fits the cap."""
    if cluster_cap is not None and total_wanted > cluster_cap and total_wanted > 0:
        return cluster_cap / total_wanted
    return 1.0


def cluster_shares(wanted: Mapping[K, float], cluster_cap: float | None
                   ) -> dict[K, ClusterShare]:
    """Each policy's budget: what it wants, scaled down together to fit the cluster cap."""
    # Exactly rounded, so the budgets do not depend on the order policies are listed in.
    total = math.fsum(wanted.values())
    factor = scale_factor(total, cluster_cap)
    return {key: ClusterShare(budget=value * factor, wanted=value, total_wanted=total,
                              policies=len(wanted), cluster_cap=cluster_cap)
            for key, value in wanted.items()}


def policy_budgets(wanted: Mapping[K, float], cluster_cap: float | None) -> dict[K, float]:
    """Each policy's budget (`cluster_shares`), in bytes/s."""
    return {key: share.budget for key, share in cluster_shares(wanted, cluster_cap).items()}


def joint_sizing(inputs: Mapping[K, sizing.SizingInput], cluster_cap: float | None
                 ) -> dict[K, tuple[sizing.Sizing, ClusterShare]]:
    """Every valid policy's sizing under the cluster cap as applied to all of
    them together: a policy's allowed bandwidth, drain time and effective
    overlap are those of its joint budget, and the cluster cap is the binding
    one whenever the joint scaling cut it. Invalid inputs are left out (their
    status says why on its own)."""
    alone: dict[K, sizing.Sizing] = {}
    for key, inp in inputs.items():
        try:
            alone[key] = sizing.compute(dataclasses.replace(inp, cluster_cap=None))
        except InvalidInput:
            continue
    split = cluster_shares({k: s.allowed_bandwidth for k, s in alone.items()}, cluster_cap)
    out: dict[K, tuple[sizing.Sizing, ClusterShare]] = {}
    for key, share in split.items():
        # The policy's part of the cluster cap is its joint budget; where the
        # cap does not bind jointly it binds for no one.
        part = share.budget if share.scaled else None
        try:
            out[key] = (sizing.compute(dataclasses.replace(inputs[key], cluster_cap=part)),
                        share)
        except InvalidInput:  # a share so small the checkpoint would never drain
            continue
    return out
