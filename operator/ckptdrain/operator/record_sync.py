"""One pass over a policy's Checkpoint records: a record's aggregate (state,
size, tiers, completion) and owner, then retention and the policy's recovery
point. The handlers schedule it once per burst of claims (operator/coalesce.py);
this module makes the writes, from the records and the policy as indexed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from ckptdrain.contract import api
from ckptdrain.operator import kube, metrics, records
from ckptdrain.operator import policy as pol
from ckptdrain.operator import status as st
from ckptdrain.operator.config import OperatorConfig

Key = tuple[str, str]


def summarise(key: Key, record: str | None, cfg: OperatorConfig,
              recs: list[dict[str, Any]], policy_body: Mapping[str, Any] | None,
              lock: threading.Lock, logger: logging.Logger) -> None:
    """Aggregate `record` (None: only sweep, e.g. after a deletion), then sweep
    the policy (`recs`: its records as indexed; `lock`: the policy's)."""
    with metrics.reconciling("checkpoint"):
        body = next((r for r in recs if r.get("metadata", {}).get("name") == record),
                    None) if record else None
        if body is not None:
            change = records.aggregate_patch(body, datetime.now(UTC))
            if change:
                kube.patch_status(api.CHECKPOINTS, key[0], record or "", change)
                # The index has not seen that patch yet: the sweep below must
                # (a recovery point without its completion time otherwise).
                fresh = {**body, "status": {**(body.get("status") or {}), **change}}
                recs = [fresh if r is body else r for r in recs]
            owner = records.owner_patch(body, (policy_body or {}).get("metadata", {})
                                        .get("uid"))
            if owner:
                kube.patch_object(api.CHECKPOINTS, key[0], record or "", owner)
        sweep(key, cfg, recs, policy_body, lock, logger)


def sweep(key: Key, cfg: OperatorConfig, recs: list[dict[str, Any]],
          policy_body: Mapping[str, Any] | None, lock: threading.Lock,
          logger: logging.Logger) -> None:
    """Retention and the policy's recovery point, from the records of one policy."""
    keep = pol.DEFAULT_GLOBAL_KEEP
    if policy_body is not None:
        keep = (policy_body.get("spec", {}).get("storage") or {}).get("keep", keep)
    now = datetime.now(UTC)
    with lock:
        for rec_name in records.to_expire(recs, keep):
            kube.patch_status(api.CHECKPOINTS, key[0], rec_name,
                              {"state": "Expired", "expiredTime": api.timestamp(now)})
            metrics.RETENTION_EXPIRED.labels(*key).inc()
            logger.info("expired checkpoint %s/%s (keep=%s)", key[0], rec_name, keep)
        for rec in expired_past_ttl(recs, cfg.expired_ttl_s, now):
            kube.delete(api.CHECKPOINTS, key[0], rec)
        if policy_body is None:
            return
        local, glob, when = records.latest_steps(recs)
        wanted = st.recovery_fields(local, glob, when)
        current = policy_body.get("status") or {}
        if any(current.get(k) != v for k, v in wanted.items()):
            kube.patch_status(api.POLICIES, key[0], key[1], wanted)


def expired_past_ttl(recs: Iterable[dict[str, Any]], ttl_s: float,
                     now: datetime) -> list[str]:
    out = []
    for rec in recs:
        status = rec.get("status") or {}
        if status.get("state") != "Expired" or not status.get("expiredTime"):
            continue
        since = api.parse_timestamp(status["expiredTime"])
        if now - since >= timedelta(seconds=ttl_s):
            out.append(rec["metadata"]["name"])
    return out
