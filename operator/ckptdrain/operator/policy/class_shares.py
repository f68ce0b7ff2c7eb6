"""A CheckpointClass's cap on its policies together (spec.bandwidthCap): the
first stage of the split. Pure.

The bandwidth is split by weighted max-min fairness with nested caps: every
policy gets min(wanted, weight × min(μ, λ)), where λ is the cluster's water
level (operator/policy/fair_share.py) and μ its class's, the level at which
the class's policies with pods fill its cap (no cap, or a cap they do not
fill: μ = ∞). That is the cluster's water-filling run over each policy's
demand already cut to its class's cap: a class below its cap is cut only
where the cluster cap cuts everyone, and what a capped class leaves goes to
the other policies, each still no more than it wants.

    policy demands ──(per capped class: FairShares over its cap)──▶ demands
        under their class caps ──(FairShares over the cluster cap)──▶ budgets

Only policies with pods count toward a class's cap, as toward the cluster's.
What an idle one would get once counted is its class's part with it
(`prospective`, level μ' ≤ μ), then the cluster's with that demand added,
the others of its class left uncut: exact, because the two splits agree at
every cluster level up to μ' (below it the cluster's level cuts the class's
policies harder than μ or μ' does), and above μ' it gets its class's part
either way.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from ckptdrain.operator.policy.fair_share import Demand, FairShares

K = TypeVar("K")


@dataclass(frozen=True)
class ClassCap:
    """A class's name and spec.bandwidthCap (bytes/s)."""

    name: str
    cap: float


@dataclass(frozen=True)
class ClassPart:
    """A policy's class cap and whom it shares it with (its status says so)."""

    name: str
    cap: float
    #: The class's policies with pods (this one included when it has pods),
    #: what they want together, and their weights together.
    policies: int
    total_wanted: float
    total_weight: int


class ClassSplit(Generic[K]):
    """Each capped class's cap split among its counted policies."""

    def __init__(self, demands: Mapping[K, Demand], counted: Collection[K],
                 caps: Mapping[K, ClassCap]) -> None:
        self._caps = {k: c for k, c in caps.items() if k in demands}
        members: dict[str, dict[K, Demand]] = {}
        cap_of: dict[str, float] = {}
        for key, cls in self._caps.items():
            group = members.setdefault(cls.name, {})
            cap_of[cls.name] = cls.cap
            if key in counted:
                group[key] = demands[key]
        self._members = members
        self._fair = {name: FairShares(group, cap_of[name]) for name, group in members.items()}

    def capped(self, key: K, demand: Demand) -> float:
        """A counted policy's demand cut to its part of its class's cap."""
        cls = self._caps.get(key)
        return demand.wanted if cls is None else self._fair[cls.name].budget(demand)

    def prospective(self, key: K, demand: Demand) -> float:
        """What an uncounted policy would get of its class's cap once counted."""
        cls = self._caps.get(key)
        return demand.wanted if cls is None else self._fair[cls.name].prospective(demand)

    def part(self, key: K, demand: Demand, counted: bool) -> ClassPart | None:
        """The policy's class cap and its sharers; None: its class sets no cap."""
        cls = self._caps.get(key)
        if cls is None:
            return None
        fair = self._fair[cls.name]
        group = self._members[cls.name]
        extra = 0 if counted else 1
        return ClassPart(cls.name, cls.cap, len(group) + extra,
                         fair.total_wanted + (0.0 if counted else demand.wanted),
                         fair.total_weight + (0 if counted else demand.weight))
