"""Which policy writes a workload that the pods of two policies share (a
JobSet's trainer Job under one policy, its eval Job under another). Pure.

Each writes its own document; were both to write, the annotation would
ping-pong between them pass after pass. The first policy by
namespace/name that has live writer pods under the workload writes it;
the others leave it alone until that one's pods are gone. Kept in memory:
a new term (apiserver/leadership.py) learns it again within a pass each.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

Key = tuple[str, str]  # a policy: namespace, name


class Claims:
    """Per workload (uid): the policies with live writer pods under it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_uid: dict[str, set[Key]] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_uid)

    def hold(self, policy: Key, uids: Iterable[str]) -> None:
        """`policy` has live pods under exactly these workloads now."""
        now = set(uids)
        with self._lock:
            for uid, policies in list(self._by_uid.items()):
                if uid not in now:
                    policies.discard(policy)
                    if not policies:
                        del self._by_uid[uid]
            for uid in now:
                self._by_uid.setdefault(uid, set()).add(policy)

    def writer(self, uid: str, asking: Key) -> Key:
        """The policy that writes workload `uid` (`asking` where none holds it)."""
        with self._lock:
            return min(self._by_uid.get(uid) or {asking})

    def keep_only(self, uids: set[str]) -> None:
        with self._lock:
            for uid in [u for u in self._by_uid if u not in uids]:
                del self._by_uid[uid]

    def clear(self) -> None:
        with self._lock:
            self._by_uid.clear()
