"""The drain watchdog: a drain that silently stops must be impossible to miss.

One thread per operator process, started by the first policy handler (the
Kopf indexes it reads are live views). A thread, not a Kopf timer: timers
would put a finalizer on every policy. Stalls are judged against each
policy's drain time under its joint budget (the cluster cap as applied to
every policy together), not the time it would take alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from ckptdrain import sizing
from ckptdrain.contract import api
from ckptdrain.operator.apiserver import kube, leadership
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import status as st
from ckptdrain.operator.records import aggregate as records

Key = tuple[str, str]
#: Each valid policy's key → (its sizing under the joint budget, ...).
Joint = Callable[[], Mapping[Key, tuple[sizing.Sizing, Any, Any]]]

#: Status writes that lost to a newer version in a row before a pass gives up.
WRITE_ATTEMPTS = 3

_started = threading.Event()


def start(cfg: OperatorConfig, policies: kopf.Index[Key, Any], pods: kopf.Index[Key, Any],
          checkpoints: kopf.Index[Key, Any], joint: Joint, logger: logging.Logger) -> None:
    """Start the watchdog once per process; later calls do nothing."""
    if _started.is_set():
        return
    _started.set()

    def loop() -> None:
        while True:
            time.sleep(cfg.watchdog_s)
            if not leadership.active():
                continue  # a standby's indexes are not live: only the active one judges
            try:
                check(policies, pods, checkpoints, joint())
            except (kube.ApiException, kube.HTTPError, RuntimeError) as error:
                logger.warning("stall check failed (%s); next in %ss", error, cfg.watchdog_s)
            except Exception:  # logged: the watchdog must outlive one bad pass
                logger.exception("stall check failed; next in %ss", cfg.watchdog_s)

    threading.Thread(target=loop, name="ckptdrain-watchdog", daemon=True).start()


def _values(index: kopf.Index[Key, Any], key: Key) -> list[Any]:
    return [v for v in index.get(key, []) if v is not None]


def _parse_time(text: str | None) -> datetime | None:
    return None if not text else api.parse_timestamp(text)


def check(policies: kopf.Index[Key, Any], pods: kopf.Index[Key, Any],
          checkpoints: kopf.Index[Key, Any],
          joint: Mapping[Key, tuple[sizing.Sizing, Any, Any]]) -> None:
    """One pass: set or clear DrainStalled on every valid policy. One
    policy's failed write stops no other's; the first failure is raised at
    the end (the loop logs it and the next period tries again)."""
    now = datetime.now(UTC)
    failed: list[Exception] = []
    for key in list(policies):
        body = next(iter(_values(policies, key)), None)
        if body is None or key not in joint:
            continue
        try:
            _check_one(key, body, joint[key][0], _values(pods, key),
                       _values(checkpoints, key), now)
        except (kube.ApiException, kube.HTTPError, RuntimeError) as error:
            failed.append(error)
    if failed:
        raise failed[0]


def _check_one(key: Key, body: dict[str, Any], sized: sizing.Sizing, drainers: list[Any],
               checkpoints: list[Any], now: datetime) -> None:
    started = [t for t in (_parse_time(d.created) for d in drainers) if t is not None]
    since = max([_parse_time(body["metadata"].get("creationTimestamp")) or now,
                 min(started, default=now)])
    _, _, when = records.latest_steps(checkpoints)
    stall = st.drain_stall(_parse_time(when), since, sized.global_interval_s,
                           sized.drain_seconds, len(drainers), now)
    generation = body["metadata"].get("generation")

    def change_of(current: dict[str, Any]) -> dict[str, Any] | None:
        if (current.get("metadata") or {}).get("generation") != generation:
            return None  # judged under another spec's intervals: the next period's
        return st.with_stall(current.get("status") or {}, stall, generation, now)

    # At the version read, recomputed on a conflict: no other writer's
    # condition is dropped by a write from an older read.
    if kube.write_status_from(api.POLICIES, key[0], dict(body), change_of, WRITE_ATTEMPTS):
        kube.post_event(body, api.KIND_POLICY, "DrainStalled" if stall else "DrainResumed",
                        stall or "a checkpoint completed globally again",
                        "Warning" if stall else "Normal")
