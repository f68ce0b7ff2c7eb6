"""Which checkpoint each restored pod started from, in its policy's status.

A pod's restore init container annotates the pod with where it restored
from (`ckptdrain.io/restored`). The policy's `status.restores` lists the
newest MAX_RESTORES of them. A job's restart is one restore per writer at
once, so the pods' events only note what is new (`observe`), and one
coalesced pass per policy writes the burst with one status patch (`record`).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ckptdrain.contract import api
from ckptdrain.operator import metrics
from ckptdrain.operator.apiserver import kube, leadership
from ckptdrain.operator.coalesce import Coalescer, drop_handled

Key = tuple[str, str]
MAX_RESTORES = 10
RETRY_DELAY_S = 5.0
DELAY_S = 0.5

#: Pods (by uid) whose restore is already noted. The status keeps only the
#: newest MAX_RESTORES entries, so it cannot answer "recorded already?" for a
#: policy with more pods than that: every event of every older pod would
#: record it again. One entry per live pod; a restart forgets them, which
#: costs at most one more entry and Event per pod.
_seen: dict[str, str] = {}
#: Per policy: restores noted but not yet in the status
#: (pod -> (source, time, the order noted in: newest last)).
_new: dict[Key, dict[str, tuple[str, str, int]]] = {}
#: Per policy: the list last written. The index may not have seen that
#: patch yet when the next pass reads it, and would lose its entries.
_written: dict[Key, list[dict[str, Any]]] = {}
_order = itertools.count()
_lock = threading.Lock()


def _new_term() -> None:
    """Another replica wrote the statuses while this one stood by."""
    _written.clear()


leadership.on_new_term(_new_term)
_passes = Coalescer("recording restores", RETRY_DELAY_S)


def observe(key: Key, uid: str, pod: str, source: str | None, deleted: bool,
            now: str) -> bool:
    """Note one pod event; True when it brings a restore not noted before
    (then its Event is due, and `schedule`)."""
    with _lock:
        if deleted:
            _seen.pop(uid, None)
            return False
        if not source or _seen.get(uid) == source:
            return False
        _seen[uid] = source
        _new.setdefault(key, {})[pod] = (source, now, next(_order))
    return True


def schedule(key: Key, policy: Callable[[], Mapping[str, Any] | None],
             logger: logging.Logger) -> None:
    """`record` for `key` soon, once for the burst; `policy()` reads the
    policy as the index holds it when the pass runs."""
    _passes.schedule(key, lambda: record(key, policy()), logger, DELAY_S)


def record(key: Key, policy: Mapping[str, Any] | None) -> None:
    """The noted restores into the policy's status (newest first, at most
    MAX_RESTORES); a failed patch keeps them for the retry."""
    with _lock:
        fresh = dict(_new.get(key) or {})
        if policy is None:  # gone: its pods' restores go with it
            _new.pop(key, None)
            _written.pop(key, None)
            return
    if not fresh:
        return
    restores = list(_written.get(key) or (policy.get("status") or {}).get("restores") or [])
    added = [{"pod": pod, "source": source, "time": at}
             for pod, (source, at, _) in sorted(fresh.items(), key=lambda kv: kv[1][2],
                                                reverse=True)
             if not any(r.get("pod") == pod and r.get("source") == source for r in restores)]
    if added:
        listed = [*added, *restores][:MAX_RESTORES]
        if not kube.patch_status(api.POLICIES, key[0], key[1], {"restores": listed}):
            return  # the policy is gone
        with _lock:
            _written[key] = listed
        for entry in added:
            metrics.observe_restored(key[0], key[1], entry["source"])
    with _lock:
        drop_handled(_new, key, fresh)


def forget(key: Key) -> None:
    """A deleted policy: its unrecorded restores go with it."""
    with _lock:
        _new.pop(key, None)
        _written.pop(key, None)
