"""Which steps the peer tier makes restorable. Pure.

A step is restorable only if *every* writer can get it from some tier. Every
writer decides alone, so the decision uses only what every writer sees the
same way: the steps each writer's holder(s) hold for it, and the steps
complete in the global tier. (A writer's own local tier is a faster *source*
for a chosen step, never a reason to choose it: the other writers cannot see
it, and ranks must not end up on different steps.)

Steps complete globally are the existing plan's (restore/plan.py); this adds
the newer ones the peers make whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def peer_steps(writers: int, held: Mapping[int, Iterable[int]],
               global_steps: Iterable[int]) -> list[int]:
    """Steps not complete globally that every writer can get from its holder or
    the global tier, newest first. `held[w]`: steps w's holder(s) hold for w
    (a writer missing from `held` holds nothing)."""
    complete = set(global_steps)
    sets = [set(held.get(w, ())) for w in range(writers)]
    offered = set().union(*sets) - complete
    return sorted((s for s in offered if all(s in h or s in complete for h in sets)),
                  reverse=True)
