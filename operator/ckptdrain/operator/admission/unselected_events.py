"""Posting the sweep's `Unselected` Events: each object once, across restarts.

What to post is decided in admission/unselected.py (one Event per pod, one
per controller). Here it is posted so that it stays once:
- in a process, a uid is claimed before its Event is posted, so two sweeps
  never post it twice, and released if the post fails, so a later sweep
  retries it;
- after a start (or after this replica regains leadership) the namespace's
  Events from us with reason `Unselected` are listed once, with one
  server-side field selector, and the objects they name are skipped: a
  restart or a failover does not post them all again.
Posting holds no lock a sweep waits on, and a failed post (an API error, a
broken connection) is logged and never stops the sweep.
"""

from __future__ import annotations

import logging
import threading

from ckptdrain.operator.admission import unselected
from ckptdrain.operator.apiserver import kube

#: By namespace, the uids with an Event posted, or being posted now; a
#: namespace is a key once its Events from us were read since the start.
_posted: dict[str, set[str]] = {}
_lock = threading.Lock()

#: What a failed read or post can raise: the apiserver's answer, or no answer.
FAILURES = (kube.ApiException, kube.HTTPError, OSError)


def post(namespace: str, notices: list[unselected.Notice], logger: logging.Logger) -> int:
    """Post those of `notices` not posted yet; returns how many were posted."""
    if not notices:
        return 0
    with _lock:
        known = namespace in _posted
    if not known:
        try:
            seen = kube.events_posted(namespace, unselected.REASON)
        except FAILURES as error:
            logger.warning("reading the Unselected Events of %s failed (%s); the next "
                           "sweep retries", namespace, error)
            return 0
        with _lock:
            _posted.setdefault(namespace, set()).update(seen)
    with _lock:
        posted = _posted.setdefault(namespace, set())
        todo = [n for n in notices if n.uid not in posted]
        posted.update(n.uid for n in todo)
    done = 0
    for n in todo:
        try:
            kube.post_event({"metadata": {"name": n.name, "namespace": namespace,
                                          "uid": n.uid}},
                            n.kind, unselected.REASON, n.message, api_version=n.api_version)
        except FAILURES as error:
            with _lock:
                _posted.get(namespace, set()).discard(n.uid)
            logger.warning("posting an Unselected Event on %s %s/%s failed (%s); the next "
                           "sweep retries", n.kind, namespace, n.name, error)
            continue
        done += 1
        if n.kind == "Pod":
            logger.warning("pod %s/%s runs without injection: no CheckpointPolicy selects it",
                           namespace, n.name)
    return done


def keep_only(namespace: str, uids: set[str]) -> None:
    """Forget the objects of `namespace` no longer flagged (pods gone, or now
    selected), so that one flagged again is posted again."""
    with _lock:
        if namespace in _posted:
            _posted[namespace].intersection_update(uids)


def forget() -> None:
    """This replica stopped reconciling: another may post meanwhile, so read
    the namespaces' Events again before posting, should it resume."""
    with _lock:
        _posted.clear()
