"""The labels of a policy's namespace, for a CheckpointClass that allows
namespaces by label (policy/class_namespaces.py).

Read by `get` on the one namespace, never a list or watch of all of them:
the operator needs the labels only of namespaces whose policies name such a
class, and `get` by name is the least the RBAC can grant. Policy admission
reads afresh (`fresh`); the operator's reconciles and pod admission take a
reading at most MAX_AGE_S old (`recent`), and the operator's recheck
(class_events.py) reads afresh each period, so a namespace relabelled is
judged again within one period without a watch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from urllib.parse import quote

from ckptdrain.errors import InvalidInput
from ckptdrain.operator.apiserver import reads

#: How old a reading `recent` hands out may be.
MAX_AGE_S = 30.0
#: A read made inside a reconcile or a pod's admission: short.
READ_TIMEOUT_S = 3.0
READ_ERRORS = (reads.ApiError, reads.HTTPError, OSError)

_lock = threading.Lock()
#: Namespace → (monotonic time read, its labels).
_readings: dict[str, tuple[float, dict[str, str]]] = {}


def fresh(namespace: str, timeout: float = READ_TIMEOUT_S) -> dict[str, str]:
    """The namespace's labels now; raises the read's error (READ_ERRORS)."""
    found = reads.get_json(f"/api/v1/namespaces/{quote(namespace, safe='')}", [], timeout)
    labels = (found.get("metadata") or {}).get("labels") or {}
    labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}
    with _lock:
        _readings[namespace] = (time.monotonic(), labels)
    return labels


def recent(namespace: str, timeout: float = READ_TIMEOUT_S) -> dict[str, str]:
    """The namespace's labels read at most MAX_AGE_S ago, or read now; when
    a read fails, the last reading of any age; with none, InvalidInput naming
    the namespace (its policy is judged again at the next recheck)."""
    with _lock:
        held = _readings.get(namespace)
    if held is not None and time.monotonic() - held[0] < MAX_AGE_S:
        return held[1]
    try:
        return fresh(namespace, timeout)
    except READ_ERRORS as error:
        if held is not None:
            return held[1]
        raise InvalidInput("metadata.namespace", f"the labels of namespace {namespace} "
                           "(its CheckpointClass allows namespaces by label) to be readable",
                           str(error)) from None


def forget() -> None:
    """Drop every reading (a new term, a test)."""
    with _lock:
        _readings.clear()
