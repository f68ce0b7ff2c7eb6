"""The last full answer of the joint budgets (bandwidth/rebalance.py
`budgets`), what it was asked with, and when: a policy's own pass reuses it
while nothing it depends on moved, with no pass over every policy and pod.
Pure but for its lock."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

Key = tuple[str, str]


@dataclass(frozen=True)
class Answer:
    """A full answer of `budgets`, what it was asked with, and when."""

    #: PolicyChanges.version read before the index was.
    version: int
    #: namespace_labels.version() when asked.
    labels: int
    cfg: Any
    budgets: dict[Key, Any]
    #: Each policy's (uid, generation) as the answer read it.
    stamps: dict[Key, tuple[str, int] | None]
    #: When asked (monotonic).
    at: float

    def holds(self, version: int, cfg: Any, labels: int, now: float, reuse_s: float,
              key: Key, stamp: tuple[str, int] | None) -> bool:
        """Whether it still answers for `key` read with `stamp`: no change
        told since, the same config and labels, at most `reuse_s` old, and
        the policy as it read it."""
        return self.version == version and self.cfg is cfg and self.labels == labels \
            and now - self.at <= reuse_s and stamp is not None \
            and self.stamps.get(key) == stamp


class AnswerMemo:
    """The newest answer kept: one asked earlier never replaces it."""

    def __init__(self) -> None:
        self._last: Answer | None = None
        self._lock = threading.Lock()

    @property
    def last(self) -> Answer | None:
        with self._lock:
            return self._last

    def keep(self, answer: Answer) -> None:
        with self._lock:
            last = self._last
            if last is None or (last.version, last.at) <= (answer.version, answer.at):
                self._last = answer

    def clear(self) -> None:
        with self._lock:
            self._last = None
