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

from ckptdrain.contract import api
from ckptdrain.operator.admission import LabelKey, label_key

Key = tuple[str, str]
#: How long one watch request lasts before it is renewed (the server ends it).
WATCH_S = 300
#: Waits between attempts after a failed list or watch.
RETRY_S = (0.5, 1.0, 2.0, 5.0)


class PolicyMirror:
    """Policies by (namespace, name) and by label key; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bodies: dict[Key, dict[str, Any]] = {}
        self._by_label: dict[LabelKey, dict[Key, dict[str, Any]]] = {}
        self._current = False
        self._version = ""

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

    @property
    def current(self) -> bool:
        with self._lock:
            return self._current

    # -- what the watch feeds it (pure, tested without a server) -------------

    def replace(self, items: list[dict[str, Any]], version: str) -> None:
        """A fresh list: the view becomes exactly `items`, and current."""
        with self._lock:
            self._bodies.clear()
            self._by_label.clear()
            for body in items:
                self._file(body)
            self._version = version
            self._current = True

    def apply(self, kind: str, body: dict[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED, BOOKMARK)."""
        version = (body.get("metadata") or {}).get("resourceVersion") or ""
        with self._lock:
            if kind in ("ADDED", "MODIFIED"):
                self._file(body)
            elif kind == "DELETED":
                self._unfile(_key(body))
            if version:
                self._version = version

    def lost(self) -> None:
        """The watch failed: offer nothing until the next list."""
        with self._lock:
            self._current = False

    @property
    def version(self) -> str:
        with self._lock:
            return self._version

    def _file(self, body: dict[str, Any]) -> None:
        key = _key(body)
        self._unfile(key)
        spec = body.get("spec") or {}
        selector = spec.get("selector") if isinstance(spec, Mapping) else None
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
    from ckptdrain import kubeclient

    custom = kubeclient.custom_objects_api()

    def list_all() -> tuple[list[dict[str, Any]], str]:
        if namespace:
            found = custom.list_namespaced_custom_object(api.GROUP, api.VERSION, namespace,
                                                         api.POLICIES)
        else:
            found = custom.list_cluster_custom_object(api.GROUP, api.VERSION, api.POLICIES)
        return list(found.get("items") or []), found["metadata"]["resourceVersion"]

    def watch_once() -> None:
        call, args = ((custom.list_namespaced_custom_object,
                       (api.GROUP, api.VERSION, namespace, api.POLICIES)) if namespace else
                      (custom.list_cluster_custom_object, (api.GROUP, api.VERSION, api.POLICIES)))
        events, stop = kubeclient.watch_stream(
            call, *args, resource_version=mirror.version, allow_watch_bookmarks=True,
            timeout_seconds=WATCH_S, _request_timeout=WATCH_S + 30)
        try:
            for event in events:
                if stopping.is_set():
                    return
                kind, obj = event.get("type"), event.get("object")
                if kind == "ERROR" or not isinstance(obj, dict):
                    raise RuntimeError(f"watch of CheckpointPolicies ended: {obj}")
                mirror.apply(kind, obj)
        finally:
            stop()

    def run() -> None:
        failures = 0
        while not stopping.is_set():
            try:
                if not mirror.current:
                    items, version = list_all()
                    mirror.replace(items, version)
                    logger.info("admission: %d CheckpointPolicies in view", len(items))
                watch_once()
                failures = 0
            except Exception as error:  # any failure: relist, never a stale view
                mirror.lost()
                delay = RETRY_S[min(failures, len(RETRY_S) - 1)]
                failures += 1
                logger.warning("admission: the view of CheckpointPolicies is not current "
                               "(%s); the apiserver is asked meanwhile; retrying in %.1fs",
                               error, delay)
                stopping.wait(delay)

    thread = threading.Thread(target=run, name="ckptdrain-policy-mirror", daemon=True)
    thread.start()
    return thread
