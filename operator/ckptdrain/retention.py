"""Retention rules, pure: which checkpoints may go. One room for every tier.

- Global (the store; each writer prunes its own objects, transfer/prune.py):
  keep the newest `keep` complete steps. Anything older than the oldest step
  kept (complete or not) may be deleted; a step newer than that is never
  touched, since an incomplete newer step may still be draining on another
  node. Nothing goes until `keep` steps are complete.
- Records (the operator's Checkpoint records, operator/records/aggregate.py): the same
  newest `keep` complete steps stay; older complete ones are marked Expired.
  The newest complete step is never expired, even with keep 0.
- Local (the node's NVMe tier, node/localtier.py): keep the newest `keep`
  steps, every step being drained, and the newest step not yet global when
  it is newer than every global one.
"""

from __future__ import annotations

from collections.abc import Iterable


def newest_complete(complete: Iterable[int], keep: int) -> list[int]:
    """The newest `keep` complete steps, newest first: what global retention keeps."""
    return sorted(set(complete), reverse=True)[:keep]


def global_expired(complete: Iterable[int], present: Iterable[int], keep: int) -> list[int]:
    """Steps of `present` that may be deleted, oldest first.

    Nothing goes until `keep` steps are complete; the newest complete step
    never goes (keep >= 1 is required)."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be a whole number >= 1, got {keep!r}")
    kept = newest_complete(complete, keep)
    if len(kept) < keep:
        return []
    oldest_kept = kept[-1]
    return sorted(step for step in set(present) if step < oldest_kept)


def complete_expired(complete: Iterable[int], keep: int) -> list[int]:
    """Complete steps beyond the newest `keep`, newest first; never the newest complete."""
    steps = set(complete)
    kept = set(newest_complete(steps, max(1, keep)))
    return sorted(steps - kept, reverse=True)


def local_expired(
    steps: Iterable[int], keep: int, global_steps: Iterable[int], protected: Iterable[int]
) -> list[int]:
    """Which local steps to delete, oldest first.

    Keeps the newest `keep`, every `protected` step (being drained or queued
    for it), and the newest step not yet global when it is newer than every
    global one: until it lands, it is the only copy of the recovery point.
    """
    ordered = sorted(set(steps), reverse=True)
    keep_set = set(ordered[:keep]) | set(protected)
    global_set = set(global_steps)
    newest_global = max((s for s in ordered if s in global_set), default=-1)
    pending = [s for s in ordered if s not in global_set and s > newest_global]
    if pending:
        keep_set.add(pending[0])
    return sorted(s for s in ordered if s not in keep_set)
