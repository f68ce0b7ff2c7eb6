"""Which scheduled captures go to the global tier when `globalEvery` > 1.

A step is complete globally only when every writer drained its shard of that
same step, so every writer's agent must pick the same steps, with no word
between them. What the agents share is the trainer's step numbers and when
the step was saved: ranks in lockstep save a step together. So the choice is a
function of the save time, not of how many captures this agent has made
(agents that started on different steps, or missed a capture, would count out
of phase for ever and no step would ever complete globally).

Wall time is cut into periods of `interval × globalEvery` seconds counted from
the epoch (the same on every node); the first step saved in a period goes
global. An agent's first capture always goes global too: after a (re)start it
cannot know what the others chose; if it differs, the next period agrees.

A step's save time is its directory's modification time: when the trainer
created the last entry in it, before publishing it by rename. Writers that
finish writing on either side of a period's boundary choose differently for
that one period (the chance is their spread in finishing times over the
period); the next period agrees again.
"""

from __future__ import annotations

import math
from pathlib import Path


def period_of(saved_at: float, period_s: float) -> int:
    """The period (counted from the epoch) a step saved at `saved_at` falls in."""
    return math.floor(saved_at / period_s)


def saved_at(step_path: Path) -> float:
    """When the trainer saved a published step (see the module doc)."""
    return step_path.stat().st_mtime


class GlobalChoice:
    """The global tier's share of one agent's scheduled captures."""

    def __init__(self, interval_s: float, every: int) -> None:
        self.every = every
        self.period_s = interval_s * every
        self._last_period: int | None = None

    def choose(self, saved: float) -> bool:
        """Whether a scheduled capture of a step saved at `saved` goes global."""
        if self.every == 1:
            return True  # every local checkpoint goes global
        period = period_of(saved, self.period_s)
        if self._last_period is not None and period <= self._last_period:
            return False
        self._last_period = period
        return True

    def sent(self, saved: float) -> None:
        """A capture went global for another reason (SIGTERM): its period is served."""
        period = period_of(saved, self.period_s)
        if self._last_period is None or period > self._last_period:
            self._last_period = period
