"""Which replica reconciles: Kopf peering, read back so that our own threads
follow the same choice.

Every replica serves the admission webhooks; Kopf peering pauses the watch
streams of all but the replica with the highest priority, so only that one
runs handlers, fills indexes and writes. Kopf does not pause its webhook
server, and it does not tell a process whether it is paused. Our threads
that work without a Kopf event (the stall watchdog, the unprotected-pod
sweep) and the webhook, which must not trust the indexes of a paused
replica (empty, or frozen at the moment it paused), ask `active()`.

`active()` mirrors Kopf's rule (engines/peering.py) over the peering
object's status: paused while any other live peer has a higher priority or
the same one. No peering object (or no peering CRD) means no peering: every
replica works, as Kopf does then.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import urllib3


def _priority(raw: str | None) -> int:
    """CKPTDRAIN_PEERING_PRIORITY (a whole number in [1, 2**31 - 1]: to prefer
    one replica, or to order them in a test), else random, so that two
    replicas never tie (a tie pauses both)."""
    if not raw:
        return random.randint(1, 2**31 - 1)
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) < 2**31:
        raise ValueError(f"CKPTDRAIN_PEERING_PRIORITY: expected a whole number in "
                         f"[1, 2147483647], got {raw!r:.40}")
    return int(raw)


#: This process's peering priority, chosen once per process.
PRIORITY = _priority(os.environ.get("CKPTDRAIN_PEERING_PRIORITY"))


def own_identity() -> str:
    """A peer id unique per process: the pod's name (or host), pid and a nonce."""
    where = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{where}/{os.getpid()}/{random.randrange(16**6):06x}"


IDENTITY = own_identity()


def _parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def is_active(status: Mapping[str, Any] | None, identity: str, priority: int,
              now: datetime) -> bool:
    """Kopf's pausing rule over a peering object's status (peer id → {priority,
    lastseen, lifetime}): active unless another live peer outranks or ties us."""
    for peer, info in (status or {}).items():
        if peer == identity or not isinstance(info, Mapping):
            continue
        # As Kopf: no lastseen counts as seen now; no lifetime as 60 s.
        seen = _parse_time(info.get("lastseen")) or now
        lifetime = info.get("lifetime")
        lifetime = lifetime if isinstance(lifetime, int | float) else 60
        if seen + timedelta(seconds=lifetime) <= now:
            continue  # dead: Kopf ignores it (and cleans it up)
        if int(info.get("priority", 0)) >= priority:
            return False
    return True


class Leadership:
    """The cached answer of `is_active` for this process, refreshed by `refresh()`
    (the periodic loop calls it); standalone processes are always active.

    Becoming active again after a standby starts a new term: while this
    replica was paused another one wrote statuses and objects, so whatever a
    module remembers of its own last writes is stale. Such modules register
    a reset with `on_new_term`; it runs before `active()` answers True again.
    Work that must start at once in a new term registers `on_term_started`:
    it runs after, when `active()` answers True."""

    def __init__(self) -> None:
        self._active = True
        self._lock = threading.Lock()
        self._resets: list[Callable[[], None]] = []
        self._starts: list[Callable[[], None]] = []

    def active(self) -> bool:
        with self._lock:
            return self._active

    def set(self, value: bool) -> None:
        with self._lock:
            returning = value and not self._active
            resets = list(self._resets) if returning else []
            if not returning:
                self._active = value
        for reset in resets:  # outside the lock: a reset may take its module's
            reset()
        if returning:
            with self._lock:
                self._active = True
                starts = list(self._starts)
            for start in starts:
                start()

    def on_new_term(self, reset: Callable[[], None]) -> None:
        with self._lock:
            self._resets.append(reset)

    def on_term_started(self, start: Callable[[], None]) -> None:
        with self._lock:
            self._starts.append(start)


STATE = Leadership()


def active() -> bool:
    return STATE.active()


def on_new_term(reset: Callable[[], None]) -> None:
    """Call `reset` whenever this replica becomes active after a standby."""
    STATE.on_new_term(reset)


def on_term_started(start: Callable[[], None]) -> None:
    """Call `start` (it must not block) whenever this replica becomes active
    after a standby, once `active()` answers True."""
    STATE.on_term_started(start)


#: How often a replica re-reads the peering object. Kopf's own hand-over is
#: immediate; our threads follow within this period.
REFRESH_S = 5.0
_started = threading.Event()


def start(peering: str, namespace: str | None, standalone: bool,
          logger: logging.Logger) -> None:
    """Keep STATE in step with Kopf's choice, in a daemon thread (once per process)."""
    if standalone or not peering:
        STATE.set(True)
        return
    if _started.is_set():
        return  # a retried startup handler: one reader is enough
    _started.set()
    STATE.set(False)  # until the first read: never act on a guess
    from ckptdrain.operator.apiserver import kube

    def loop() -> None:
        known: bool | None = None  # the role last logged
        while True:
            try:
                found = kube.read_peering(peering, namespace)
                now = datetime.now(UTC)
                active = found is None or is_active(found.get("status"), IDENTITY, PRIORITY, now)
                if active != known:
                    known = active
                    logger.info("this replica is now %s", "active (reconciles)" if active
                                else "standby (serves webhooks only)")
                STATE.set(active)
            except (kube.ApiException, OSError, urllib3.exceptions.HTTPError) as error:
                # Keep the last answer and retry: a blip must not flip roles.
                logger.warning("reading peering %s failed (%s); retrying in %ss",
                               peering, error, REFRESH_S)
            time.sleep(REFRESH_S)

    threading.Thread(target=loop, name="ckptdrain-leadership", daemon=True).start()
