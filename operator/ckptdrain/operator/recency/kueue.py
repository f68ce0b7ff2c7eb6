"""The Kueue Workloads of a workload, for the recency annotation
(recency/publish.py): found by Kueue's own job-uid label, never by listing a
namespace's Workloads (thousands of finished ones would all be read), and
kept only where their owner references name an object of the owner chain.

Kueue's API is looked for once; again after DISCOVERY_S while absent (a
Kueue installed later is noticed without a restart), and at once when a
list answers 404 (Kueue upgraded and no longer serves that version).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from ckptdrain.operator.apiserver import workload_objects
from ckptdrain.operator.recency import document, owners

GROUP, PLURAL = "kueue.x-k8s.io", "workloads"
#: Kueue labels each Workload with the uid of the job it was made for.
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
DISCOVERY_S = 600.0

_lock = threading.Lock()
#: (when looked for, the apiVersion served or None); None: not looked for.
_found: tuple[float, str | None] | None = None


def selector(uids: Iterable[str]) -> str:
    """The label selector for the Workloads of any of these objects."""
    return f"{JOB_UID_LABEL} in ({','.join(sorted(set(uids)))})"


def _version(again: bool = False) -> str | None:
    global _found
    now = time.monotonic()
    with _lock:
        known = _found
    if again or known is None or (known[1] is None and now - known[0] > DISCOVERY_S):
        known = (now, workload_objects.served_version(GROUP, PLURAL))
        with _lock:
            _found = known
    return known[1]


def served() -> str | None:
    """The apiVersion of Kueue's Workloads as last looked for; None where
    Kueue is not installed."""
    return _version()


def forget() -> None:
    """Look for Kueue again on the next call (tests; a new term)."""
    global _found
    with _lock:
        _found = None


def workloads(namespace: str, chain: tuple[str, ...]) -> list[owners.Owner]:
    """The Kueue Workloads that name one of `chain` (a workload and what lies
    between it and the pods) as owner; [] where Kueue is not installed.
    Raises what the apiserver raises, but a 404 (the version moved)."""
    if not chain:
        return []
    found = None
    for again in (False, True):
        version = _version(again)
        if version is None:
            return []
        found = workload_objects.list_in(version, PLURAL, namespace, selector(chain))
        if found is not None:
            break
    if found is None or version is None:
        return []
    out = []
    for w in found:
        if not any(owners.names_owner(w, uid) for uid in chain):
            continue  # a label is only a hint: the owner reference decides
        meta = w.get("metadata") or {}
        value = (meta.get("annotations") or {}).get(document.ANNOTATION_RECENCY)
        out.append(owners.Owner(version, "Workload", PLURAL, meta.get("name", ""),
                                meta.get("uid", ""), value if isinstance(value, str) else None))
    return out
