"""Which checkpoint to restore, and in what order to try the candidates. Pure.

Rules:
- newest step first; at equal steps the preferred tier first (default local:
  NVMe is faster than any store, and it is verified while copied);
- with several writers, every rank must restore the *same* step, and ranks
  cannot see each other's local tiers. So only steps complete in the global
  tier are eligible (the global commit protocol guarantees every rank has
  them); the local copy of such a step is still used when present. A step
  that only ever reached the local tiers is lost in that case: the price of
  not coordinating ranks during restore. The same holds for readers, and
  for a writer whose readers restore beside it. A pod that restores alone
  (one writer, no readers) may take any local step;
- a step whose writer count differs from the configured one is never
  eligible (restoring it would hand this rank a different share of the
  state than the job expects): `counts` says each (tier, step)'s count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Tier = Literal["local", "peer", "global"]


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
    counts: Mapping[tuple[Tier, int], int] | None = None,
    alone: bool | None = None,
) -> list[Candidate]:
    """Every (step, tier) worth trying, best first. `alone`: no other pod
    restores this job's checkpoints (default: one writer)."""
    counts = counts or {}
    alone = writers == 1 if alone is None else alone
    global_set = set(global_steps)
    eligible_local = [s for s in local_steps if alone or s in global_set]
    found = [Candidate(s, "local") for s in set(eligible_local)]
    found += [Candidate(s, "global") for s in global_set]
    found = [c for c in found if counts.get((c.tier, c.step), writers) == writers]
    rank = {"local": 0, "global": 1} if prefer == "local" else {"global": 0, "local": 1}
    return sorted(found, key=lambda c: (-c.step, rank[c.tier]))


def wrong_writers(counts: Mapping[tuple[Tier, int], int], writers: int) -> list[Candidate]:
    """The (step, tier)s `candidates` leaves out for their writer count, newest first."""
    return sorted((Candidate(step, tier) for (tier, step), n in counts.items() if n != writers),
                  key=lambda c: (-c.step, c.tier))
