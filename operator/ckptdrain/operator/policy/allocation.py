"""How much each policy may drain at. Pure.

Each policy's allowed bandwidth is its sizing, already bounded by its own
cap. When the policies with pods together want more than the cluster cap,
it is split fairly by weight (operator/policy/fair_share.py): a policy that
wants less than its part gets all it wants, the others share the rest by
weight, and no one's declared size takes another's part. A CheckpointClass's
spec.bandwidthCap bounds its policies together, with or without a cluster
cap, and what it leaves goes to the others (operator/policy/class_shares.py). (How a policy's
budget is split among its drainers is the share channel's: contract/share.py,
operator/bandwidth/share_channel.py.)
Each policy's sizing and status are then built from that joint budget
(`joint_sizing`), never from the policy alone against the cluster cap.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from ckptdrain import sizing
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.policy import fair_share
from ckptdrain.operator.policy.class_shares import ClassCap, ClassPart, ClassSplit

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
    #: Its spec.nodeSelector as admitted (sorted pairs): a class's placement
    #: edit is judged against it (policy/class_placement.py `stranded`).
    node_selector: tuple[tuple[str, str], ...] = ()


def parse_annotation_number(text: object) -> float | None:
    """A non-negative number from an annotation, or None if absent or malformed."""
    if not isinstance(text, str):
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


#: Every channel's claim on the cluster cap (bytes/s): larger than any cap,
#: so claim × factor is the namespace's weight × level, whatever the cap.
CLAIM = 1e18


@dataclass(frozen=True)
class ClusterShare:
    """One policy's part of the cluster cap and of its class's cap, each
    split fairly by weight among the policies with pods
    (operator/policy/fair_share.py, class_shares.py)."""

    #: Bytes/s the policy may drain at: what it wanted, cut to its fair part
    #: (for a policy with no pods: what it would get once one runs).
    budget: float
    #: What it wanted alone (its sizing, bounded by its own cap only).
    wanted: float
    #: What the counted policies wanted together, and how many there were.
    total_wanted: float
    policies: int
    cluster_cap: float | None
    #: Its weight, and the counted policies' weights together.
    weight: int = 1
    total_weight: int = 1
    #: It has pods, so it takes part in the split (an idle policy does not).
    counted: bool = True
    #: The water level: bytes/s per unit of weight every cut policy gets
    #: (None: the cap does not bind the counted policies).
    level: float | None = None
    #: Its class's cap and whom it shares it with (None: its class sets none).
    class_part: ClassPart | None = None
    #: Its class's cap, not the cluster's, is what cuts it.
    class_bound: bool = False
    #: What the counted policies want together once their classes' caps cut
    #: them (None: no class cap cuts any).
    total_capped: float | None = None
    #: What it wants once its class's cap cuts it (its share of that cap).
    wanted_in_class: float | None = None

    @property
    def factor(self) -> float:
        """Its own cluster scale (policies weigh differently); its namespace's
        scale is the largest of its draining policies' (of all its policies'
        while none drains: bandwidth/share_channel.py `namespace_factors`).
        With the claim `claim_under` gives under that scale, what agents
        apply to their channel's budget, min(budget, claim × scale) =
        min(budget, weight × level), is the fair part; 1 when the cap does
        not bind."""
        if self.level is None or self.cluster_cap is None:
            return 1.0
        return min(1.0, max(self.weight * self.level / CLAIM, 1.0 / CLAIM))

    @property
    def claim(self) -> float | None:
        """The claim of a policy whose factor is its namespace's: CLAIM, so
        that a new cap makes no channel written before it claim more than its
        factor says; a lighter policy of its namespace claims less
        (`claim_under`)."""
        return None if self.cluster_cap is None else CLAIM

    def claim_under(self, factor: float) -> int | None:
        """What its channel claims under its namespace's scale `factor` so
        that claim × factor is its own fair part (weight × level):
        CLAIM × weight ÷ the weight `factor` stands for, never above CLAIM
        (a policy heavier than its namespace's factor gets less than its
        part). None where no claim says its part: no cluster cap, or a
        factor taken at another level than its own."""
        if self.claim is None or self.factor <= 0:
            return None
        ratio = self.weight * factor / self.factor  # the weight the factor stands for
        ref = round(ratio)
        if ref < 1 or not math.isclose(ratio, ref, rel_tol=1e-9):
            return None
        return int(CLAIM) if ref <= self.weight else int(CLAIM * self.weight / ref)

    @property
    def scaled(self) -> bool:
        """A cap over several policies (the cluster's or its class's) bound:
        this policy gets less than it wanted."""
        return self.budget < self.wanted

    @property
    def carried(self) -> bool:
        """Its cut is the cluster scale's to carry (claim × factor, the
        cluster's level): the cluster cap cut it. A cut by its class's cap
        no factor says; only its channel can."""
        return self.scaled and not self.class_bound


def cluster_shares(wanted: Mapping[K, float], cluster_cap: float | None,
                   counted: Collection[K] | None = None,
                   weights: Mapping[K, int] | None = None,
                   classes: Mapping[K, ClassCap] | None = None) -> dict[K, ClusterShare]:
    """Each policy's budget: what it wants, cut fairly by weight to fit its
    class's cap (`classes`: by policy, where its class sets one) and the
    cluster cap among the `counted` ones (default: all); each uncounted
    one's is what it would get once counted."""
    weights = weights or {}
    counted_keys = set(wanted) if counted is None else set(counted) & set(wanted)
    demands = {k: fair_share.Demand(v, weights.get(k, 1)) for k, v in wanted.items()}
    split = ClassSplit(demands, counted_keys, classes or {})
    capped = {k: fair_share.Demand(split.capped(k, demands[k]), demands[k].weight)
              for k in counted_keys}
    total = math.fsum(wanted[k] for k in counted_keys)
    total_capped = math.fsum(capped[k].wanted for k in counted_keys)
    total_weight = sum(demands[k].weight for k in counted_keys)
    fair = None if cluster_cap is None else fair_share.FairShares(capped, cluster_cap)

    def share(k: K, d: fair_share.Demand) -> ClusterShare:
        is_counted = k in counted_keys
        in_class = capped[k].wanted if is_counted else split.prospective(k, d)
        if fair is None:
            budget = in_class
        elif is_counted:
            budget = fair.budget(capped[k])
        else:
            # Exact although its class's others are not cut with it: the
            # cluster's level decides its part only below its class's new
            # level, where their cut demands do not matter (class_shares.py).
            budget = fair.prospective(fair_share.Demand(in_class, d.weight))
        part = split.part(k, d, is_counted)
        return ClusterShare(
            budget=budget, wanted=d.wanted, total_wanted=total, policies=len(counted_keys),
            cluster_cap=cluster_cap, weight=d.weight,
            total_weight=total_weight, counted=is_counted,
            level=None if fair is None else fair.level, class_part=part,
            class_bound=part is not None and in_class < d.wanted and budget >= in_class,
            total_capped=None if total_capped >= total else total_capped,
            wanted_in_class=in_class)

    return {k: share(k, d) for k, d in demands.items()}


def policy_budgets(wanted: Mapping[K, float], cluster_cap: float | None,
                   counted: Collection[K] | None = None,
                   weights: Mapping[K, int] | None = None,
                   classes: Mapping[K, ClassCap] | None = None) -> dict[K, float]:
    """Each policy's budget (`cluster_shares`), in bytes/s."""
    return {key: share.budget for key, share in
            cluster_shares(wanted, cluster_cap, counted, weights, classes).items()}


def joint_sizing(inputs: Mapping[K, sizing.SizingInput], cluster_cap: float | None,
                 counted: Collection[K] | None = None, weights: Mapping[K, int] | None = None,
                 classes: Mapping[K, ClassCap] | None = None,
                 ) -> dict[K, tuple[sizing.Sizing, ClusterShare]]:
    """Every valid policy's sizing under the cluster cap as applied to all of
    them together: a policy's allowed bandwidth, drain time and effective
    overlap are those of its joint budget, and the cluster cap is the binding
    one whenever the joint scaling cut it (sizing's "cluster": the share's
    `class_bound` tells when it was its class's cap). Invalid inputs are
    left out (their status says why on its own)."""
    alone: dict[K, sizing.Sizing] = {}
    for key, inp in inputs.items():
        try:
            alone[key] = sizing.compute(dataclasses.replace(inp, cluster_cap=None))
        except InvalidInput:
            continue
    split = cluster_shares({k: s.allowed_bandwidth for k, s in alone.items()}, cluster_cap,
                           counted, weights, classes)
    out: dict[K, tuple[sizing.Sizing, ClusterShare]] = {}
    for key, share in split.items():
        # The policy's part of the cluster cap (and its class's) is its joint
        # budget; where neither binds jointly it binds for no one.
        part = share.budget if share.scaled else None
        try:
            out[key] = (sizing.compute(dataclasses.replace(inputs[key], cluster_cap=part)),
                        share)
        except InvalidInput:  # a share so small the checkpoint would never drain
            continue
    return out
