"""Retention rules, pure: which checkpoints may go.

Global retention keeps the newest `keep` complete steps. Anything older than
the oldest step kept (complete or not) may be deleted; a step newer than
that is never touched, since an incomplete newer step may still be
draining on another node.
"""

from __future__ import annotations

from collections.abc import Iterable


def global_expired(complete: Iterable[int], present: Iterable[int], keep: int) -> list[int]:
    """Steps of `present` that may be deleted, oldest first.

    Nothing goes until `keep` steps are complete; the newest complete step
    never goes (keep >= 1 is required)."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep must be a whole number >= 1, got {keep!r}")
    kept = sorted(set(complete), reverse=True)[:keep]
    if len(kept) < keep:
        return []
    oldest_kept = kept[-1]
    return sorted(step for step in set(present) if step < oldest_kept)
