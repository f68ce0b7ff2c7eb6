"""The pod census, wired: every policy's `status.pods` and Ready's verdict
on its pods (admission/protection.py classifies, policy/readiness.py
writes the status), kept current by pod and policy events and once every
CKPTDRAIN_WATCHDOG_PERIOD (a pod starting for too long turns unprotected
without an event).

The pods come from the census's own store (admission/pod_store.py), a few
fields of each opted-in pod, kept by pod events (the server-side label
selector handlers.py sets) and corrected by a LIST on each new term of
leadership and every RECONCILE_EVERY_S (a paused or re-listed watch never
hears of the pods deleted meanwhile), so a pass costs no API read; it
writes a policy's status only when its counts or its Ready change, at the
resourceVersion it read (a newer verdict, such as the sizing pass's
InvalidSpec, is never overwritten by a stale one), and only on the active
replica (apiserver/leadership.py). A failed pass raises, so its Coalescer
retries it; a new term of leadership counts every namespace again, after
the LIST (its names only), held for at most HOLD_LIMIT_S: a sizing pass
meanwhile leaves a counted policy's pods as they were. A sizing pass
writes its own count, taken from the same store as it writes, at the
resourceVersion it read too (policy_reconcile.write_status).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import kopf

from ckptdrain.contract import api
from ckptdrain.operator.admission import protection
from ckptdrain.operator.admission.pod_store import PodStore
from ckptdrain.operator.apiserver import kube, leadership, policy_edge
from ckptdrain.operator.coalesce import Coalescer
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import readiness

#: At v1beta1, the storage version (apiserver/policy_edge.py).
POLICIES = policy_edge.RESOURCE
OPTED_IN = {api.LABEL_INJECT: "true"}
#: Pod events within this window are coalesced into one pass per namespace.
CENSUS_DELAY_S = 0.5
#: Conflicting status writes in a row before a pass gives up (and is retried).
WRITE_ATTEMPTS = 3
#: How often the store is checked against a LIST of the opted-in pods.
RECONCILE_EVERY_S = 300.0
#: How long a new term holds the counts waiting for its LIST: past it (a
#: LIST that neither returns nor fails), counting resumes, with a warning.
HOLD_LIMIT_S = 120.0
#: How often a held pass says so.
HOLD_LOG_EVERY_S = 30.0
Policies = kopf.Index[Any, Any]


@kopf.on.event("v1", "pods", labels=OPTED_IN)
def pod_census_event(type: str | None, namespace: str, name: str, body: kopf.Body,
                     memo: kopf.Memo, checkpointpolicy_index: Policies, **_: Any) -> None:
    """A pod came, went, or changed what the census sees of it: count its
    namespace soon. Most pod events (a writer's progress annotations, at
    thousands per checkpoint) change nothing the census sees: no pass. The
    pass is the namespace's, not the pod's: it logs as the census."""
    _start(memo.config, checkpointpolicy_index)
    seen = None if type == "DELETED" else protection.view(dict(body))
    uid = str(body.get("metadata", {}).get("uid") or "")
    if _store.see(namespace, name, seen, time.monotonic(), uid):
        _schedule(namespace, _log)


@kopf.on.event(*POLICIES)
def policy_census_event(type: str | None, namespace: str, name: str, body: kopf.Body,
                        memo: kopf.Memo, logger: logging.Logger,
                        checkpointpolicy_index: Policies, **_: Any) -> None:
    """A policy came, or its selector or validity changed: count it soon."""
    _start(memo.config, checkpointpolicy_index)
    if type != "DELETED" and (type in (None, "ADDED")
                              or readiness.needs_count(policy_edge.seen(body))):
        _schedule(namespace, logger)


def policy_census(namespace: str, name: str, selector: Any, now: datetime,
                  limit_s: float = protection.STARTING_LIMIT_S,
                  counted_before: bool = False) -> protection.Census | None:
    """One policy's census from the store: what the sizing pass writes with
    its Ready, so the first Ready a policy gets already counts its pods.
    None while a new term waits for its LIST, for a policy `counted_before`:
    the store may still hold pods deleted unseen, so its pods' verdict stays
    as it was until the census counts after the LIST. A policy never counted
    is counted even then: a pod deleted unseen can only add to its
    unprotected pods, never hide one."""
    if counted_before and _hold.held():
        return None
    return protection.tally(name, selector or {}, _store.views(namespace), now, limit_s)


def count_namespace(namespace: str, views: list[protection.PodView], policies: Policies,
                    logger: logging.Logger, now: datetime | None = None,
                    limit_s: float = protection.STARTING_LIMIT_S) -> int:
    """Count the pods of every policy of `namespace` (`views`, its live
    opted-in pods) and write what changed; returns how many policies'
    statuses were written. Raises the first failure after trying every
    policy: one failed write stops no other."""
    bodies = [dict(b) for key in list(policies) if key[0] == namespace
              for b in policies.get(key, []) if b]
    now = now or datetime.now(UTC)
    # Each injected pod goes to its own policy; only bare pods are matched
    # against every selector: a pass costs pods + policies x bare pods.
    bare = [p for p in views if not p.injected]
    injected: dict[str | None, list[protection.PodView]] = {}
    for p in views:
        if p.injected:
            injected.setdefault(p.policy, []).append(p)

    def census_of(body: dict[str, Any]) -> protection.Census:
        name = body["metadata"]["name"]
        selector = (body.get("spec") or {}).get("selector") or {}
        return protection.tally(name, selector, [*injected.get(name, []), *bare], now, limit_s)

    written = 0
    failed: Exception | None = None
    for body in bodies:
        try:
            written += _write(namespace, body, census_of, now)
        except (kube.ApiException, kube.HTTPError, OSError, RuntimeError) as error:
            logger.warning("writing the pod census of policy %s/%s failed (%s)",
                           namespace, body["metadata"]["name"], error)
            failed = failed or error
    if failed is not None:
        raise failed
    return written


def _write(namespace: str, body: dict[str, Any],
           census_of: Callable[[dict[str, Any]], protection.Census], now: datetime) -> bool:
    """Write one policy's census unless it is right, at the resourceVersion
    it was computed from; on a conflict, read the policy again and recompute
    (its verdict may have changed: invalid now, or a new selector). True when
    written."""
    def change_of(current: dict[str, Any]) -> dict[str, Any] | None:
        census = census_of(current)
        return readiness.with_pods(current.get("status") or {}, census.counts(),
                                   census.unprotected,
                                   current["metadata"].get("generation"), now)
    return kube.write_status_from(api.POLICIES, namespace, body, change_of, WRITE_ATTEMPTS)


# -- when it runs ----------------------------------------------------------------

_passes = Coalescer("counting the policies' pods")
#: The Coalescer's key of the LIST (namespaces are strings: no clash).
RECONCILE_KEY = ("list of the opted-in pods",)
_lock = threading.Lock()
#: What the census knows of each live opted-in pod.
_store = PodStore()


class TermHold:
    """From a new term until a LIST begun in it ends, or HOLD_LIMIT_S: no
    pass counts meanwhile. Terms are numbered, so a LIST begun before the
    term releases nothing."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._term = 0
        self._since: float | None = None
        self._told = 0.0

    def begin(self) -> None:
        with self._lock:
            self._term += 1
            self._since = self._told = self._clock()
        _log.info("a new term: the pod census waits for its LIST of the pods (at most %.0f s)",
                  HOLD_LIMIT_S)

    def term(self) -> int:
        with self._lock:
            return self._term

    def release(self, term: int) -> None:
        """The LIST begun in `term` ended (or failed)."""
        with self._lock:
            if term == self._term:
                self._since = None

    def held(self) -> bool:
        with self._lock:
            if self._since is None:
                return False
            now = self._clock()
            if now - self._since >= HOLD_LIMIT_S:
                self._since = None
                _log.warning("the LIST of the pods has not ended in %.0f s: the pod census "
                             "counts again; pods deleted while this replica stood by may "
                             "show until a LIST ends", HOLD_LIMIT_S)
                return False
            if now - self._told >= HOLD_LOG_EVERY_S:
                self._told = now
                _log.info("the pod census waits for the LIST of the pods, %.0f s now",
                          now - self._since)
            return True

    def is_set(self) -> bool:
        with self._lock:
            return self._since is not None


#: The periodic and new-term passes are nobody's event: their own log.
_log = logging.getLogger("ckptdrain.census")
#: Held from a new term until its LIST ends: no pass counts meanwhile.
_hold = TermHold()
#: The indexes and settings a pass reads, set by the first event.
_wiring: dict[str, Any] = {}


def _schedule(namespace: str, logger: logging.Logger) -> None:
    _passes.schedule(namespace, lambda: _count(namespace, logger), logger, CENSUS_DELAY_S)


def _count(namespace: str, logger: logging.Logger) -> None:
    """One pass; raises on failure, so the Coalescer retries it."""
    if not leadership.active():
        return  # a standby's indexes are not live; a new term counts all again
    if not _wiring:
        return  # no event yet: the first ones schedule their namespaces
    if _hold.held():
        return  # the store may hold pods deleted unseen: the LIST counts all after
    cfg: OperatorConfig = _wiring["config"]
    count_namespace(namespace, _store.views(namespace), _wiring["policies"], logger,
                    limit_s=cfg.starting_limit_s)


def reconcile() -> None:
    """Drop from the store every pod a LIST of the opted-in pods does not
    hold (deleted while no watch ran here), then count every namespace.
    Raises when the LIST fails (its Coalescer retries), after counting.
    Only the active replica lists: a standby's store is not live."""
    if not leadership.active():
        return  # the next term lists again
    cfg: OperatorConfig = _wiring["config"]
    scope = cfg.namespace or None
    term = _hold.term()  # a term begun during the LIST waits for its own
    started = time.monotonic()
    try:
        listed = kube.list_pod_names(scope, f"{api.LABEL_INJECT}=true")
        dropped = _store.reconcile(listed, started, scope)
        if dropped:
            _log.info("the pod census forgot %d pods deleted unseen: %s", len(dropped),
                      ", ".join(f"{ns}/{name}" for ns, name in sorted(dropped)[:10]))
    finally:
        _hold.release(term)  # a failed LIST holds the counts no longer: they are retried
        _schedule_all()


def _schedule_reconcile() -> None:
    """LIST the opted-in pods soon; then count every namespace."""
    if _wiring:
        _passes.schedule(RECONCILE_KEY, reconcile, _log, CENSUS_DELAY_S)


def _new_term() -> None:
    """Count nothing until the LIST: the policy and pod events of the watches
    resuming now would count the pods deleted while this replica stood by."""
    if _wiring:
        _hold.begin()
        _schedule_reconcile()


def _schedule_all() -> None:
    """Count every namespace that has policies, soon."""
    if not _wiring:
        return  # no event yet: the first ones schedule their namespaces
    for namespace in sorted({key[0] for key in list(_wiring["policies"])}):
        _schedule(namespace, _log)


def _start(cfg: OperatorConfig, policies: Policies) -> None:
    """Once per process: keep what a pass reads, and every watchdog period
    count every namespace that has policies (a pod starting for too long
    turns unprotected without an event), after a LIST every
    RECONCILE_EVERY_S."""
    with _lock:
        if _wiring:
            return
        _wiring.update(config=cfg, policies=policies)

    def loop() -> None:
        listed = time.monotonic()
        while True:
            time.sleep(cfg.watchdog_s)
            try:
                if time.monotonic() - listed >= RECONCILE_EVERY_S and leadership.active():
                    listed = time.monotonic()
                    _schedule_reconcile()
                else:
                    _schedule_all()
            except Exception:  # the loop is all there is: it must go on
                _log.exception("scheduling the periodic pod census failed; it runs again "
                               "in %.0f s", cfg.watchdog_s)

    threading.Thread(target=loop, name="ckptdrain-census", daemon=True).start()


# Passes dropped while this replica stood by (or while its leadership lagged)
# are owed, and pods were deleted unseen: a new term lists the pods, then
# counts everything again.
leadership.on_new_term(_new_term)
