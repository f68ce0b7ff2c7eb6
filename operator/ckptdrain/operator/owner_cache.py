"""Owner objects read at admission, kept for a few seconds.

A Job or JobSet of N pods sends N admissions within seconds, each naming the
same Job (and, above it, the same JobSet) as its controller; each admission
read them from the apiserver: 2N GETs for one job start, on an apiserver busy
creating the N pods. Here an owner is read once (concurrent admissions for
the same owner wait for that one read) and kept for `ttl` seconds, and only
for the object it was read as: a reference with another uid (a Job deleted
and created again under its name) reads anew. What admission derives from an
owner (the writer count, the completion mode) changes only when the workload
is edited, and an edit is seen within `ttl`. An owner that could not be read
is not kept: the next admission asks again.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

Read = Callable[[str, str, str, str], "dict[str, Any] | None"]
Key = tuple[str, str, str, str]

TTL_S = 5.0
MAX_ENTRIES = 4096


class OwnerCache:
    """`get(api_version, plural, namespace, name, uid)`: the object, from
    `read` at most once per `ttl` while its uid stays the one asked for."""

    def __init__(self, read: Read, *, ttl: float = TTL_S, max_entries: int = MAX_ENTRIES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read, self._ttl, self._max, self._clock = read, ttl, max_entries, clock
        self._entries: OrderedDict[Key, tuple[dict[str, Any], float]] = OrderedDict()
        self._lock = threading.Lock()
        self._reading: dict[Key, threading.Lock] = {}
        self.reads = 0  # how many times the apiserver was asked (for tests and metrics)

    def get(self, api_version: str, plural: str, namespace: str, name: str,
            uid: str | None = None) -> dict[str, Any] | None:
        key = (api_version, plural, namespace, name)
        found = self._fresh(key, uid)
        if found is not None:
            return found
        with self._lock:
            single = self._reading.setdefault(key, threading.Lock())
        with single:  # one read per owner at a time; the others take its answer
            found = self._fresh(key, uid)
            if found is not None:
                return found
            obj = self._read(api_version, plural, namespace, name)
            with self._lock:
                self.reads += 1
                self._reading.pop(key, None)
                if obj is not None and _uid(obj) is not None and (uid is None or
                                                                  _uid(obj) == uid):
                    self._entries[key] = (obj, self._clock() + self._ttl)
                    self._entries.move_to_end(key)
                    while len(self._entries) > self._max:
                        self._entries.popitem(last=False)
            return obj

    def peek(self, api_version: str, plural: str, namespace: str, name: str,
             uid: str | None = None) -> dict[str, Any] | None:
        """The object if it is kept and fresh; never reads."""
        return self._fresh((api_version, plural, namespace, name), uid)

    def _fresh(self, key: Key, uid: str | None) -> dict[str, Any] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            obj, expires = entry
            if self._clock() >= expires or (uid is not None and _uid(obj) != uid):
                del self._entries[key]
                return None
            return obj


def _uid(obj: dict[str, Any]) -> str | None:
    uid = (obj.get("metadata") or {}).get("uid")
    return str(uid) if uid else None
