"""The cluster bandwidth cap split fairly by weight among the policies that run. Pure.

Weighted max-min fairness (water-filling): a policy that wants less than its
fair part gets all it wants, and what it leaves is split among the others in
proportion to their weights. There is one water level λ (bytes/s per unit of
weight): every policy gets min(wanted, weight × λ), and λ is the level at
which those add up to the cap. So a tenant that declares a huge model gets
at most its weight's part of the cap, never a part that grows with what it
declares, and a small job is never slowed by a big one.

Only policies with pods count: an idle policy takes no part of the cap. What
it would get the moment its first pod runs (`prospective`) is what its status
shows meanwhile.

The cut is found in O(log n) per question after one sort: the policies sorted
by wanted ÷ weight (the level at which each stops being cut), with prefix sums
of what the uncut ones want and suffix sums of the cut ones' weights.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Generic, TypeVar

K = TypeVar("K")

@dataclass(frozen=True)
class Demand:
    """What a policy wants alone (bytes/s) and its weight (a whole number >= 1)."""

    wanted: float
    weight: int = 1


class FairShares(Generic[K]):
    """The split of `cap` among the counted policies' demands."""

    def __init__(self, demands: Mapping[K, Demand], cap: float) -> None:
        self.cap = cap
        # Sorted by (the level at which a policy is no longer cut, its name),
        # so the answer does not depend on the order policies are listed in.
        order = sorted(demands.items(), key=lambda kv: (kv[1].wanted / kv[1].weight, str(kv[0])))
        self._ratios = [d.wanted / d.weight for _, d in order]
        self._prefix_wanted = [0.0, *accumulate(d.wanted for _, d in order)]
        weights = [d.weight for _, d in order]
        self._suffix_weight = [0, *accumulate(reversed(weights))][::-1]
        self.total_wanted = math.fsum(d.wanted for d in demands.values())
        #: The same sum as the search adds it up: whether the cap binds is
        #: decided on it, so the search always finds a policy to cut.
        self._sum = self._prefix_wanted[-1]
        self.total_weight = sum(weights)
        self.level = self._level(None)

    def budget(self, demand: Demand) -> float:
        """A counted policy's part: what it wants, cut to its weight's part."""
        if self.level is None:
            return demand.wanted
        return min(demand.wanted, demand.weight * self.level)

    def prospective(self, demand: Demand) -> float:
        """What a policy not counted yet would get once it is (the others cut with it)."""
        if self._sum + demand.wanted <= self.cap:
            return demand.wanted
        level = self._level(demand)
        return demand.wanted if level is None else min(demand.wanted, demand.weight * level)

    def _level(self, extra: Demand | None) -> float | None:
        """λ: Σ min(wanted, weight × λ) = cap over the counted policies and
        `extra`; None when they want no more than the cap together."""
        more = 0.0 if extra is None else extra.wanted
        if self._sum + more <= self.cap:
            return None
        # The first policy (in ratio order) still cut at the level: every
        # policy before it gets what it wants.
        lo, hi = 0, len(self._ratios)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._filled(mid, self._ratios[mid], extra) <= self.cap:
                lo = mid + 1
            else:
                hi = mid
        uncut_wanted, cut_weight = self._prefix_wanted[lo], self._suffix_weight[lo]
        room = self.cap - uncut_wanted
        if extra is not None:
            # Cut too (weight × λ below what it wants), or not?
            level = room / (cut_weight + extra.weight)
            if level * extra.weight >= extra.wanted:
                room -= extra.wanted
                level = room / cut_weight if cut_weight else math.inf
        elif cut_weight:
            level = room / cut_weight
        else:
            return None  # rounding: nobody is cut after all
        return max(level, 0.0)

    def _filled(self, index: int, level: float, extra: Demand | None) -> float:
        """Σ min(wanted, weight × level) when the first `index` policies (and
        any tied with the one at `index`) are not cut."""
        uncut = bisect.bisect_right(self._ratios, level)
        total = self._prefix_wanted[uncut] + level * self._suffix_weight[uncut]
        if extra is not None:
            total += min(extra.wanted, extra.weight * level)
        return total
