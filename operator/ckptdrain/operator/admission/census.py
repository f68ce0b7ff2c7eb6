"""The pod census, wired: every policy's `status.pods` and Ready's verdict
on its pods (admission/protection.py classifies, policy/readiness.py
writes the status), kept current by pod and policy events and once every
CKPTDRAIN_WATCHDOG_PERIOD (a pod starting for too long turns unprotected
without an event).

The pods come from a Kopf index over the opted-in pods (the server-side
label selector handlers.py sets), a few fields each, so a pass costs no API
read; it writes a policy's status only when its counts or its Ready change,
and only on the active replica (apiserver/leadership.py).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

import kopf

from ckptdrain.contract import api
from ckptdrain.operator.admission import protection
from ckptdrain.operator.apiserver import kube, leadership
from ckptdrain.operator.coalesce import Coalescer
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import readiness

POLICIES = (api.GROUP, api.VERSION, api.POLICIES)
OPTED_IN = {api.LABEL_INJECT: "true"}
#: Pod events within this window are coalesced into one pass per namespace.
CENSUS_DELAY_S = 0.5
Pods = kopf.Index[str, protection.PodView]
Policies = kopf.Index[Any, Any]


@kopf.index("v1", "pods", labels=OPTED_IN)
def census_index(namespace: str, body: kopf.Body, **_: Any
                 ) -> dict[str, protection.PodView]:
    """Live opted-in pods by namespace, as the census sees them. Empty, never
    None, for a pod that finished or is being deleted: Kopf keeps an object's
    previous entry when its indexer returns None."""
    found = protection.view(dict(body))
    return {} if found is None else {namespace: found}


@kopf.on.event("v1", "pods", labels=OPTED_IN)
def pod_census_event(namespace: str, memo: kopf.Memo, logger: logging.Logger,
                     census_index: Pods, checkpointpolicy_index: Policies, **_: Any) -> None:
    """A pod came, changed or went: count its namespace soon."""
    _start_periodic(memo.config, census_index, checkpointpolicy_index, logger)
    _schedule(namespace, census_index, checkpointpolicy_index, logger)


@kopf.on.event(*POLICIES)
def policy_census_event(type: str | None, namespace: str, body: kopf.Body, memo: kopf.Memo,
                        logger: logging.Logger, census_index: Pods,
                        checkpointpolicy_index: Policies, **_: Any) -> None:
    """A policy came, or its selector or validity changed: count it soon."""
    _start_periodic(memo.config, census_index, checkpointpolicy_index, logger)
    if type in (None, "ADDED") or (type != "DELETED" and readiness.needs_count(body)):
        _schedule(namespace, census_index, checkpointpolicy_index, logger)


def count_namespace(namespace: str, pods: Pods, policies: Policies,
                    logger: logging.Logger, now: datetime | None = None) -> int:
    """Count the pods of every policy of `namespace` and write what changed;
    returns how many policies' statuses were written."""
    views = [p for p in list(pods.get(namespace, [])) if p is not None]
    bodies = [b for key in list(policies) if key[0] == namespace
              for b in policies.get(key, []) if b]
    now = now or datetime.now(UTC)
    # Each injected pod goes to its own policy; only bare pods are matched
    # against every selector: a pass costs pods + policies x bare pods.
    bare = [p for p in views if not p.injected]
    injected: dict[str | None, list[protection.PodView]] = {}
    for p in views:
        if p.injected:
            injected.setdefault(p.policy, []).append(p)
    written = 0
    for body in bodies:
        meta = body["metadata"]
        selector = (body.get("spec") or {}).get("selector") or {}
        census = protection.tally(meta["name"], selector,
                                  [*injected.get(meta["name"], []), *bare], now)
        change = readiness.with_pods(body.get("status") or {}, census.counts(),
                                     census.unprotected, meta.get("generation"), now)
        if change is None:
            continue
        try:
            kube.patch_status(api.POLICIES, namespace, meta["name"], change)
            written += 1
        except (kube.ApiException, kube.HTTPError, OSError) as error:
            # One policy's failed write stops no other; the next pass retries it.
            logger.warning("writing the pod census of policy %s/%s failed (%s)",
                           namespace, meta["name"], error)
    return written


# -- when it runs ----------------------------------------------------------------

_passes = Coalescer("counting the policies' pods")
_periodic_started = threading.Event()


def _schedule(namespace: str, pods: Pods, policies: Policies, logger: logging.Logger) -> None:
    _passes.schedule(namespace, lambda: _count_logged(namespace, pods, policies, logger),
                     logger, CENSUS_DELAY_S)


def _count_logged(namespace: str, pods: Pods, policies: Policies,
                  logger: logging.Logger) -> None:
    if not leadership.active():
        return  # a standby's indexes are not live
    try:
        count_namespace(namespace, pods, policies, logger)
    except RuntimeError as error:  # an index changed while we read it
        logger.warning("counting the pods of %s failed (%s); the next pass retries",
                       namespace, error)


def _start_periodic(cfg: OperatorConfig, pods: Pods, policies: Policies,
                    logger: logging.Logger) -> None:
    """Once per process: every watchdog period, count every namespace that
    has policies."""
    if _periodic_started.is_set():
        return
    _periodic_started.set()

    def loop() -> None:
        while True:
            time.sleep(cfg.watchdog_s)
            try:
                for namespace in sorted({key[0] for key in list(policies)}):
                    _count_logged(namespace, pods, policies, logger)
            except Exception:  # the loop is all there is: it must go on
                logger.exception("the periodic pod census failed; it runs again in %.0f s",
                                 cfg.watchdog_s)

    threading.Thread(target=loop, name="ckptdrain-census", daemon=True).start()
