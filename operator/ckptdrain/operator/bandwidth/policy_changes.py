"""Whether any policy's sizing input may have changed since a moment: what
the joint budgets' memo of full answers (bandwidth/rebalance.py) is kept
under."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ckptdrain.operator.bandwidth import budgets as jb

Key = tuple[str, str]


class PolicyChanges:
    """Whether any policy's sizing input may have changed since a moment:
    a policy came or went, or its uid or generation moved (what JointBudgets
    parses again on). Told from the policy event handler, which Kopf runs
    after its indexes hold the event's object, so a version read before the
    index is never newer than what the index holds."""

    def __init__(self) -> None:
        self.version = 0
        #: The version the last finished joint pass started from (-1: none yet).
        self.joint_version = -1
        self._stamps: dict[Key, tuple[str, int]] = {}
        self._lock = threading.Lock()

    def seen(self, key: Key, body: Mapping[str, Any], deleted: bool = False) -> None:
        stamp = jb.spec_stamp(body)
        with self._lock:
            if deleted:
                self._stamps.pop(key, None)
            elif stamp is not None and self._stamps.get(key) == stamp:
                return  # a status change, or the same spec again
            elif stamp is not None:
                self._stamps[key] = stamp
            self.version += 1

    def moved(self) -> None:
        """Something else than one policy's event may have changed them."""
        with self._lock:
            self.version += 1

    def joint_started(self) -> int:
        """A joint pass starts: the version it will cover once finished."""
        with self._lock:
            return self.version

    def joint_finished(self, version: int) -> None:
        """A joint pass that started at `version` has written every channel
        (its shrinks first): the changes told before it are covered. Not at
        its start: a policy's own pass meanwhile must still hold."""
        with self._lock:
            self.joint_version = max(self.joint_version, version)

    def joint_pending(self) -> bool:
        """A change was told since the last finished joint pass started (or
        none finished): one may be running, its shrinks not all out."""
        with self._lock:
            return self.joint_version != self.version
