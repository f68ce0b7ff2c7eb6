"""The labels of a policy's namespace, for a CheckpointClass that allows
namespaces by label (policy/class_namespaces.py).

Read by `get` on the one namespace, never a list or watch of all of them:
the operator needs the labels only of namespaces whose policies name such a
class, and `get` by name is the least the RBAC can grant. Policy admission
reads afresh (`fresh`); the operator's reconciles and pod admission take a
reading at most MAX_AGE_S old (`recent`), and the operator's recheck
(class_events.py) reads afresh each period, so a namespace relabelled is
judged again within one period without a watch.

A reading is trusted for `trusted_s` (twice the recheck period) at most:
while reads fail (an apiserver away, a 403 after an RBAC rollback) a label
removed since must not keep a namespace allowed for ever. Past that bound
the reading is dropped and `recent` raises LabelsUnreadable, as for a
namespace never read: a retry, never a judgement.

A failed read is remembered for FAILURE_MEMORY_S: while the apiserver
times out, `recent` callers within it are answered at once (the trusted
reading, or LabelsUnreadable) instead of each paying the read's timeout
again; `fresh` (policy admission, the recheck) always reads. `held` never
reads: the joint budgets (bandwidth/rebalance.py) parse from it, after
`read_untrusted` read, within READ_TIMEOUT_S for all of them, only the
namespaces that hold no trusted reading (never read, or dropped). A reading
merely older than MAX_AGE_S is used as held: the recheck keeps readings
fresh, and re-reading them for the budgets would double the GETs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from urllib.parse import quote

from ckptdrain.errors import InvalidInput
from ckptdrain.operator.apiserver import leadership, reads

#: How old a reading `recent` hands out without reading again may be.
MAX_AGE_S = 30.0
#: A read made inside a reconcile or a pod's admission: short.
READ_TIMEOUT_S = 3.0
READ_ERRORS = (reads.ApiError, reads.HTTPError, OSError)
#: How long a failed read is remembered: long enough that a burst of
#: callers (a joint pass, the reconciles of a namespace's policies) pays one
#: timeout, short enough that a recovered apiserver is read again at once.
FAILURE_MEMORY_S = 5.0


class LabelsUnreadable(InvalidInput):
    """The labels could not be read and no trusted reading is held. An
    InvalidInput so that a pass that cannot tell (the joint budgets) gives
    the policy no share; a reconcile or an admission retries instead of
    judging the policy (policy_reconcile.py, admission/rules.py)."""


_lock = threading.Lock()
#: Namespace → (monotonic time read, its labels).
_readings: dict[str, tuple[float, dict[str, str]]] = {}
#: Namespace → (monotonic time a read failed, the failure's text).
_failures: dict[str, tuple[float, str]] = {}
#: Bumped whenever what a namespace's labels say may have changed (a reading
#: that differs, one dropped): the joint budgets' memo keys on it.
_version = 0


def version() -> int:
    """Moves whenever a reading changes or is dropped."""
    return _version


def trusted_s(recheck_s: float) -> float:
    """How long a reading may allow a namespace while reads fail."""
    return max(MAX_AGE_S, 2 * recheck_s)


def _keep(namespace: str, labels: dict[str, str]) -> None:
    global _version
    with _lock:
        held = _readings.get(namespace)
        _readings[namespace] = (time.monotonic(), labels)
        _failures.pop(namespace, None)  # read: no longer failing
        if (held[1] if held else None) != labels:
            _version += 1


def fresh(namespace: str, timeout: float = READ_TIMEOUT_S, remember: bool = False
          ) -> dict[str, str]:
    """The namespace's labels now; raises the read's error (READ_ERRORS),
    remembered for FAILURE_MEMORY_S unless the read was cut short of
    READ_TIMEOUT_S by its caller's own deadline and not `remember`."""
    if not namespace:
        # An empty name would make the path the namespaces' list.
        raise ValueError("namespace: expected a namespace's name, got an empty one")
    try:
        found = reads.get_json(f"/api/v1/namespaces/{quote(namespace, safe='')}", [], timeout)
    except READ_ERRORS as error:
        # A read cut short by its caller's own budget (a policy admission
        # late in its deadline) says nothing of the apiserver: remembered, it
        # would answer every other caller with a retry for FAILURE_MEMORY_S.
        # The operator's own sweep (`read_untrusted`) cuts its reads to its
        # own bound, not an admission's: its timeouts are remembered.
        if remember or timeout >= READ_TIMEOUT_S or isinstance(error, reads.ApiError):
            with _lock:
                _failures[namespace] = (time.monotonic(), str(error))
        raise
    labels = (found.get("metadata") or {}).get("labels") or {}
    labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}
    _keep(namespace, labels)
    return labels


def recent(namespace: str, recheck_s: float, timeout: float = READ_TIMEOUT_S,
           remember: bool = False) -> dict[str, str]:
    """The namespace's labels read at most MAX_AGE_S ago, or read now; when
    a read fails (now, or less than FAILURE_MEMORY_S ago: not tried again),
    the last reading if younger than trusted_s(recheck_s); otherwise
    LabelsUnreadable naming the namespace. `remember`: as `fresh`."""
    with _lock:
        held = _readings.get(namespace)
        failed = _failures.get(namespace)
    now = time.monotonic()
    if held is not None and now - held[0] < MAX_AGE_S:
        return held[1]
    if failed is not None and now - failed[0] < FAILURE_MEMORY_S:
        problem = (f"{failed[1]} ({now - failed[0]:.1f}s ago; read again "
                   f"{FAILURE_MEMORY_S:g}s after a failure)")
    else:
        try:
            return fresh(namespace, timeout, remember)
        except READ_ERRORS as error:
            problem = str(error)
    return _trusted(namespace, held, recheck_s, problem)


def held(namespace: str, recheck_s: float) -> dict[str, str]:
    """The last reading while younger than trusted_s(recheck_s), never a
    read: LabelsUnreadable otherwise (never read, or dropped)."""
    with _lock:
        reading = _readings.get(namespace)
    return _trusted(namespace, reading, recheck_s, "no reading held; its policies' "
                    "reconciles and the namespace recheck read it")


#: One sweep of `read_untrusted` at a time: callers at once wait for it
#: (its readings, or its failures remembered) rather than read again.
_sweep = threading.Lock()
#: The last namespace a sweep read: the next one starts after it, so a
#: namespace that times out again each time does not starve those after it.
_sweep_after = ""


def read_untrusted(namespaces: list[str], recheck_s: float,
                   within_s: float = READ_TIMEOUT_S) -> list[str]:
    """Read (`recent`) those of `namespaces` (sorted) that hold no trusted reading,
    all within `within_s`; the ones not reached in time (a read refused or
    failed was reached: the recheck reads it again each period). Bounded
    whatever the apiserver does: one sweep at a time, each GET's timeout
    cut to the time left, each failure remembered (FAILURE_MEMORY_S) and
    not read again, and the next sweep starts after the last one read."""
    global _sweep_after
    deadline = time.monotonic() + within_s
    if not _sweep.acquire(timeout=within_s):
        return [ns for ns in namespaces if not _is_trusted(ns, recheck_s)]
    not_reached: list[str] = []
    try:
        cut = next((i for i, ns in enumerate(namespaces) if ns > _sweep_after),
                   len(namespaces))
        for namespace in namespaces[cut:] + namespaces[:cut]:
            if _is_trusted(namespace, recheck_s):
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                not_reached.append(namespace)
                continue
            _sweep_after = namespace
            try:
                # Remembered however short the cut: else, on a real clock
                # (left < READ_TIMEOUT_S), each sweep would GET it again.
                recent(namespace, recheck_s, min(READ_TIMEOUT_S, left), remember=True)
            except LabelsUnreadable:
                continue
    finally:
        _sweep.release()
    return not_reached


def _is_trusted(namespace: str, recheck_s: float) -> bool:
    try:
        held(namespace, recheck_s)
    except LabelsUnreadable:
        return False
    return True


def _trusted(namespace: str, reading: tuple[float, dict[str, str]] | None,
             recheck_s: float, problem: str) -> dict[str, str]:
    """`reading`'s labels while trusted; else it is dropped and
    LabelsUnreadable says `problem`."""
    if reading is not None and time.monotonic() - reading[0] < trusted_s(recheck_s):
        return reading[1]
    if reading is not None:
        _drop(namespace, reading)
    raise LabelsUnreadable("metadata.namespace", f"the labels of namespace {namespace} "
                           "(its CheckpointClass allows namespaces by label) to be "
                           "readable", problem)


def expire(recheck_s: float) -> None:
    """Drop every reading older than trusted_s(recheck_s) (the recheck,
    each period): none is kept that no longer may allow a namespace."""
    bound = time.monotonic() - trusted_s(recheck_s)
    with _lock:
        old = [(ns, reading) for ns, reading in _readings.items() if reading[0] <= bound]
        gone = time.monotonic() - FAILURE_MEMORY_S
        for namespace in [ns for ns, (at, _) in _failures.items() if at <= gone]:
            del _failures[namespace]
    for namespace, reading in old:
        _drop(namespace, reading)


def _drop(namespace: str, reading: tuple[float, dict[str, str]]) -> None:
    """Drop `reading` if it is still the one held: a read that replaced it
    since it was judged too old (another caller's `fresh`) stays."""
    global _version
    with _lock:
        if _readings.get(namespace) is reading:
            del _readings[namespace]
            _version += 1


def forget() -> None:
    """Drop every reading (a new term: another replica judged meanwhile; a test)."""
    global _version, _sweep_after
    with _lock:
        _readings.clear()
        _failures.clear()
        _version += 1
        _sweep_after = ""


leadership.on_new_term(forget)
