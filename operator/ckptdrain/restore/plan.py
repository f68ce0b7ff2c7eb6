"""Which checkpoint to restore, and in what order to try the candidates. Pure.

Rules:
- newest step first; at equal steps the preferred tier first (default local:
  NVMe is faster than any store, and it is verified while copied);
- with several writers, every rank must restore the *same* step, and ranks
  cannot see each other's local tiers. So only steps complete in the global
  tier are eligible (the global commit protocol guarantees every rank has
  them); the local copy of such a step is still used when present. A step
  that only ever reached the local tiers is lost in that case: the price of
  not coordinating ranks during restore. With one writer, any local step is
  eligible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Tier = Literal["local", "global"]


@dataclass(frozen=True)
class Candidate:
    step: int
    tier: Tier


def candidates(
    local_steps: list[int],
    global_steps: list[int],
    *,
    writers: int,
    prefer: Tier = "local",
) -> list[Candidate]:
    """Every (step, tier) worth trying, best first."""
    global_set = set(global_steps)
    eligible_local = [s for s in local_steps if writers == 1 or s in global_set]
    found = [Candidate(s, "local") for s in set(eligible_local)]
    found += [Candidate(s, "global") for s in global_set]
    rank = {"local": 0, "global": 1} if prefer == "local" else {"global": 0, "local": 1}
    return sorted(found, key=lambda c: (-c.step, rank[c.tier]))
