"""The admission process's own view of the CheckpointPolicies: one list,
then a watch from its resourceVersion, kept by a thread and filed by the
label pair each selector requires (admission.label_key). Admission reads the
few policies that could select a pod from it, with no API call and without
waiting for the operator's event loop.

Only a view that is current is offered: until the first list, and from a
failed watch until the next list succeeds, `candidates` answers None and
admission asks the apiserver instead. A policy created a moment ago may not
be in the view yet; admission asks the apiserver whenever the view names
none (admission.admit_pod), so a pod is never left bare because of the lag.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from ckptdrain.operator.admission.rules import LabelKey, label_key
from ckptdrain.operator.apiserver.policy_edge import seen
from ckptdrain.operator.apiserver.slim import without_managed_fields
from ckptdrain.operator.apiserver.watched_view import WatchedView, follow, keep_in_step
from ckptdrain.operator.policy import version_messages

Key = tuple[str, str]
#: How long one watch request lasts before it is renewed (the server ends it).
WATCH_S = 300
#: Waits between attempts after a failed list or watch.
RETRY_S = (0.5, 1.0, 2.0, 5.0)
WHAT = "CheckpointPolicies"


class PolicyMirror(WatchedView):
    """Policies by (namespace, name) and by label key; thread-safe."""

    def __init__(self) -> None:
        super().__init__()
        self._bodies: dict[Key, dict[str, Any]] = {}
        self._by_label: dict[LabelKey, dict[Key, dict[str, Any]]] = {}

    # -- what admission reads ------------------------------------------------

    def candidates(self, namespace: str, labels: Mapping[str, str]
                   ) -> list[dict[str, Any]] | None:
        """The policies of `namespace` that could select a pod with `labels`;
        None while the view is not current."""
        keys = [(namespace, k, v) for k, v in labels.items()] + [(namespace, None, None)]
        with self._lock:
            if not self._current:
                return None
            return [body for key in keys for body in self._by_label.get(key, {}).values()]

    def every(self) -> list[dict[str, Any]] | None:
        """Every policy of the view, of all its namespaces (the node
        directory check, policy/node_dirs.py); None while it is not current."""
        with self._lock:
            return list(self._bodies.values()) if self._current else None

    # -- what the watch feeds it (apiserver/watched_view.py; pure, tested without a server)

    def _clear(self) -> None:
        self._bodies.clear()
        self._by_label.clear()

    def _forget(self, obj: dict[str, Any]) -> None:
        self._unfile(_key(obj))

    def _file(self, body: dict[str, Any]) -> None:
        key = _key(body)
        self._unfile(key)
        spec = body.get("spec") or {}
        selector = spec.get("selector") if isinstance(spec, Mapping) else None
        # Read at v1beta1 (reads.policies_path), filed as the core reads it,
        # with the version each field was written at kept in managedFields'
        # place: an invalid policy's problem is said in it at pod admission.
        body = version_messages.kept_versions(without_managed_fields(seen(body)), body)
        self._bodies[key] = body
        label = label_key(key[0], selector if isinstance(selector, Mapping) else None)
        self._by_label.setdefault(label, {})[key] = body

    def _unfile(self, key: Key) -> None:
        old = self._bodies.pop(key, None)
        if old is None:
            return
        spec = old.get("spec") or {}
        selector = spec.get("selector") if isinstance(spec, Mapping) else None
        label = label_key(key[0], selector if isinstance(selector, Mapping) else None)
        filed = self._by_label.get(label, {})
        filed.pop(key, None)
        if not filed:
            self._by_label.pop(label, None)


def _key(body: Mapping[str, Any]) -> Key:
    meta = body.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


def start(mirror: PolicyMirror, namespace: str, logger: logging.Logger,
          stopping: threading.Event) -> threading.Thread:
    """Keep `mirror` in step with the apiserver in a daemon thread:
    list, watch from the list's resourceVersion, list again after any
    failure (a 410 Gone included)."""
    from ckptdrain.operator.apiserver import reads

    path = reads.policies_path(namespace)

    def list_all() -> tuple[list[dict[str, Any]], str]:
        found = reads.get_json(path, [], 60)
        return list(found.get("items") or []), found["metadata"]["resourceVersion"]

    def watch_once() -> None:
        with reads.watching(path, [], mirror.version, WATCH_S, (10, WATCH_S + 30)) as events:
            follow(events, mirror, WHAT, stopping)

    return keep_in_step(mirror, WHAT, list_all, watch_once, logger, stopping, RETRY_S,
                        "ckptdrain-policy-mirror")
