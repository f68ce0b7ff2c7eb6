"""The warning a policy admission carries when no node reports room for
one of its writers (node_room.py decides): the reads, cached, around the
pure decision. Shared by both serving paths (admission/policy_rules.py).

The reports are the CSI drivers' CSIStorageCapacity objects in
cfg.csi_capacity_namespace, listed (one LIST, by the driver's label) at
most once per CACHE_S: a burst of policy writes (a GitOps sync of a
hundred policies) makes one read. A read that fails is logged, kept
FAILED_CACHE_S, and says nothing. The LIST runs in a thread of its own
with the whole read budget; admissions wait on it, each giving up at its
own deadline: the warning is advice, and never holds up an admission past
the webhook's timeout.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any
from urllib.parse import quote

from ckptdrain.contract.csi import CAPACITY_LABEL_DRIVER
from ckptdrain.operator.admission import node_room
from ckptdrain.operator.admission.node_room import Report
from ckptdrain.operator.admission.refusal import READ_ERRORS
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.config import OperatorConfig

log = logging.getLogger("ckptdrain.admission")

#: How long one list of the reports serves admissions.
CACHE_S = 30.0
#: How long a failed list serves admissions (said nothing): a burst
#: against an apiserver that refuses or is slow makes one read, not one each.
FAILED_CACHE_S = 10.0


def capacities_path(namespace: str) -> str:
    return f"/apis/storage.k8s.io/v1/namespaces/{quote(namespace, safe='')}/csistoragecapacities"


class ReportCache:
    """The reports of one namespace and driver, listed at most once per
    `cache_s`, a failed list kept `failed_s` (`clock`: monotonic seconds).

    One LIST at a time per key, in a worker thread, with the whole read
    budget (`list_timeout_s`) whoever started it: admissions arriving
    while it runs wait on its future, each no longer than its own budget
    and holding no thread meanwhile, and what it gets is kept for the next
    ones. A late admission's leftover budget never decides the LIST's
    timeout, so its timeout is never kept as everyone's failure."""

    def __init__(self, cache_s: float = CACHE_S, failed_s: float = FAILED_CACHE_S,
                 clock: Callable[[], float] = time.monotonic,
                 list_timeout_s: float = apiserver_reads.ADMISSION_READ_TIMEOUT_S) -> None:
        self.cache_s, self.failed_s, self.clock = cache_s, failed_s, clock
        self.list_timeout_s = list_timeout_s
        # Held only to look at or change the two dicts, never across a LIST.
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, str], tuple[float, list[Report] | None]] = {}
        self._listing: dict[tuple[str, str], Future[list[Report] | None]] = {}
        self._last_error: str | None = None

    async def reports(self, namespace: str, driver: str,
                      deadline: float) -> list[Report] | None:
        """The reports, from the cache or the LIST in flight (started now
        when there is none) by `deadline` (time.monotonic()); None when the
        LIST failed (logged once per change of error) or outlasted the
        budget, or the budget is already spent (nothing listed then)."""
        key = (namespace, driver)
        if deadline - time.monotonic() <= 0:
            return None
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and self.clock() - kept[0] < (
                    self.cache_s if kept[1] is not None else self.failed_s):
                return kept[1]
            listing = self._listing.get(key)
            if listing is None:
                listing = self._listing[key] = Future()
                # Running from now: no waiter's cancellation can cancel it.
                listing.set_running_or_notify_cancel()
                threading.Thread(target=self._list_into, args=(listing, key),
                                 name="ckptdrain-node-room-list", daemon=True).start()
        waited = asyncio.wrap_future(listing)
        # asyncio.wait never cancels what it waits on: the LIST goes on for
        # the admissions after this one.
        done, _ = await asyncio.wait({waited}, timeout=max(deadline - time.monotonic(), 0.0))
        return waited.result() if done else None

    def _list_into(self, listing: Future[list[Report] | None], key: tuple[str, str]) -> None:
        """The LIST, in its own thread: kept, then handed to the waiters."""
        try:
            reports = self._list(*key, self.list_timeout_s)
        except BaseException as error:  # handed to the waiters, never lost in the thread
            with self._lock:
                self._listing.pop(key, None)
            listing.set_exception(error)
            return
        with self._lock:
            self._kept[key] = (self.clock(), reports)
            self._listing.pop(key, None)
        listing.set_result(reports)

    def _list(self, namespace: str, driver: str, timeout: float) -> list[Report] | None:
        try:
            found = apiserver_reads.get_json(
                capacities_path(namespace),
                [("labelSelector", f"{CAPACITY_LABEL_DRIVER}={driver}")], timeout)
        except READ_ERRORS as error:
            said = str(error)
            if said != self._last_error:
                log.warning("could not list the CSI drivers' free space in %s (%s): "
                            "policies are admitted without that check", namespace, said)
                self._last_error = said
            return None
        self._last_error = None
        return [r for r in (node_room.report_of(item)
                            for item in found.get("items") or []) if r is not None]


CACHE = ReportCache()


def need_changed(spec: Mapping[str, Any], old_spec: Mapping[str, Any] | None, namespace: str,
                 name: str, cfg: OperatorConfig, old_cfg: OperatorConfig | None = None) -> bool:
    """Whether a write changes what one writer keeps on its node (always,
    for a CREATE or an old spec that does not parse; never outside CSI
    mode, where nothing is parsed). Both specs with their class applied,
    `old_cfg` the old one's configuration (`cfg` when None)."""
    if not cfg.csi or not cfg.csi_capacity_namespace:
        return False
    if old_spec is None:
        return True
    before = node_room.need_of(old_spec, namespace, name, old_cfg or cfg)
    return before is None or before != node_room.need_of(spec, namespace, name, cfg)


async def room_warning(spec: Mapping[str, Any], namespace: str, name: str,
                       cfg: OperatorConfig, deadline: float,
                       cache: ReportCache = CACHE) -> str | None:
    """The warning for a policy of `spec` (its class applied), or None."""
    if not cfg.csi or not cfg.csi_capacity_namespace:
        return None
    need = node_room.need_of(spec, namespace, name, cfg)
    if need is None:
        return None
    reports = await cache.reports(cfg.csi_capacity_namespace, cfg.csi_driver, deadline)
    return None if reports is None else node_room.warning(need, reports, time.time())
