"""A newest checkpoint saved by another number of writers: handed to the
trainer to load resharded, never swapped for an older step.

A job that comes back at another world size (`spec.writers` edited: elastic
training, fewer spot nodes) finds its newest complete step saved by N
writers while it has M. No pod can restore "its" shard of it: the shards
are cut differently. Restore then places nothing and says so (outcome
`reshard`, exit 0, `step` and `step_writers` in the result); the trainer
loads the step itself, resharded:

- a DCP checkpoint (`.metadata` is writer 0's alone, as `ckptdrain.dcp`
  saves it) is always handed over: `ckptdrain.dcp.load` reads what each
  rank needs of every writer's files from the store, verified;
- any other format only when the policy says its trainer reshards
  (`spec.restore.reshard: Trainer`, CKPTDRAIN_RESTORE_RESHARD=trainer);
  otherwise restore stops with exit 4 and says what to do. A trainer that
  does not know the step is there would start from scratch.

An older step saved by M writers is never chosen instead: it would throw
the training since then away. Only the global tier counts: a step is
complete there for every writer, and a node's local copies of another
writer count are shards of the old layout.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ckptdrain.restore.plan import Candidate, Tier

#: DCP's global metadata file, which its coordinator (rank 0) writes.
DCP_METADATA = ".metadata"
OUTCOME = "reshard"


@dataclass(frozen=True)
class Pending:
    """The newest step, saved by `writers` writers (not this job's count)."""

    step: int
    writers: int


def pending(counts: Mapping[tuple[Tier, int], int], writers: int,
            plan: Iterable[Candidate]) -> Pending | None:
    """The newest global step saved by another writer count than `writers`,
    when no candidate of the plan is as new; None when the plan's best will do."""
    other = [(step, n) for (tier, step), n in counts.items() if tier == "global" and n != writers]
    if not other:
        return None
    step, n = max(other)
    if any(c.step >= step for c in plan):
        return None
    return Pending(step, n)


def dcp_metadata_holders(checkpoint: Any) -> list[int]:
    """The writers whose manifest lists DCP's `.metadata` (a DCP save: [0])."""
    return [m.writer for m in checkpoint.manifests
            if any(f.path == DCP_METADATA for f in m.files)]


def refusal(found: Pending, writers: int, mode: str, checkpoint: Any) -> str | None:
    """Why the step cannot be handed to the trainer, or None when it can."""
    if mode == "trainer" or dcp_metadata_holders(checkpoint) == [0]:
        return None
    return (f"step {found.step} was saved by {found.writers} writer(s), this job has {writers}, "
            "and it is not a DCP checkpoint that ckptdrain.dcp.load can reshard: run the job "
            f"with {found.writers} writers, set spec.restore.reshard: Trainer if the trainer "
            "reshards it itself, or annotate the pods ckptdrain.io/restore: skip to start "
            "fresh")


def handed_over(found: Pending, writers: int) -> str:
    """The result's reason for a step the trainer loads resharded."""
    return (f"step {found.step} was saved by {found.writers} writer(s), this job has {writers}: "
            "nothing placed; the trainer loads it resharded from the store "
            "(ckptdrain.dcp.load)")
