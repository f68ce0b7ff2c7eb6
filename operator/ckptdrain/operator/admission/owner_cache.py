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

from ckptdrain.operator.apiserver.slim import without_managed_fields

Read = Callable[[str, str, str, str], "dict[str, Any] | None"]
Key = tuple[str, str, str, str]

TTL_S = 5.0
MAX_ENTRIES = 1024
#: How long an admission waits for another's read of the same owner before
#: reading itself (the read's own timeout is 5 s).
WAIT_S = 10.0


class _Flight:
    """One read in progress; its answer (even None) is every waiter's."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: dict[str, Any] | None = None


class OwnerCache:
    """`get(api_version, plural, namespace, name, uid)`: the object, from
    `read` at most once per `ttl` while its uid stays the one asked for."""

    def __init__(self, read: Read, *, ttl: float = TTL_S, max_entries: int = MAX_ENTRIES,
                 clock: Callable[[], float] = time.monotonic, wait: float = WAIT_S) -> None:
        self._read, self._ttl, self._max, self._clock = read, ttl, max_entries, clock
        self._wait = wait
        self._entries: OrderedDict[Key, tuple[dict[str, Any], float]] = OrderedDict()
        self._lock = threading.Lock()
        self._flights: dict[Key, _Flight] = {}
        self.reads = 0  # how many times the apiserver was asked (for tests and metrics)

    def get(self, api_version: str, plural: str, namespace: str, name: str,
            uid: str | None = None) -> dict[str, Any] | None:
        key = (api_version, plural, namespace, name)
        found = self._fresh(key, uid)
        if found is not None:
            return found
        with self._lock:
            flight = self._flights.get(key)
            leader = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
        if not leader:
            # Another admission is reading this owner: take its answer, a
            # failed one included (reading again one after another would make
            # the k-th pod of a job wait k timeouts when the apiserver is slow).
            if flight.done.wait(self._wait):
                obj = flight.result
                if obj is None or uid is None or _uid(obj) == uid:
                    return obj
            return self._read(api_version, plural, namespace, name)
        obj: dict[str, Any] | None = None
        try:
            obj = self._read(api_version, plural, namespace, name)
            return obj
        finally:
            with self._lock:
                self.reads += 1
                del self._flights[key]
                if obj is not None and _uid(obj) is not None and (uid is None or
                                                                  _uid(obj) == uid):
                    self._entries[key] = (without_managed_fields(obj), self._clock() + self._ttl)
                    self._entries.move_to_end(key)
                    self._expire()
            flight.result = obj
            flight.done.set()

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

    def _expire(self) -> None:
        """Drop what has expired, then the oldest beyond the bound (lock held)."""
        now = self._clock()
        for key in [k for k, (_, expires) in self._entries.items() if expires <= now]:
            del self._entries[key]
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)


def _uid(obj: dict[str, Any]) -> str | None:
    uid = (obj.get("metadata") or {}).get("uid")
    return str(uid) if uid else None
