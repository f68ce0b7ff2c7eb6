"""The admission process's own view of which pods hold which writer rank: one
list, then a watch, of the pods labelled `ckptdrain.io/writer` (the few the
webhook injected with a rank), kept by a thread and filed by (namespace,
policy, rank). Admission looks a rank's holders up here with no API call;
it asked the apiserver twice per admission before, and under load those two
reads were most of an admission's time.

The view only ever shortens the way to a refusal, never to an admission
that would otherwise be refused: a holder it names is confirmed by a fresh
read before a pod is refused (admission.writer_identity), and until the
first list, or from a failed watch until the next list succeeds,
`holders_of` answers None and admission asks the apiserver as before. A
holder admitted a moment ago may not be in the view yet; the apiserver's
watch cache, which admission read before, lags in the same way (one step
less), and the operator's DuplicateWriter condition is the backstop for a
rank claimed twice at the same instant.

Only a few fields of each pod are kept (name, rank, policy, live or not):
the watch decodes each pod and keeps no more.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

from ckptdrain.contract.api import ANNOTATION_POLICY, LABEL_WRITER

#: (namespace, policy, rank) → {pod name: live}
Slot = tuple[str, str, int]
PodKey = tuple[str, str]
WATCH_S = 300
RETRY_S = (0.5, 1.0, 2.0, 5.0)
#: Pods per page of the first list.
PAGE = 500


def _slim(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What _filed reads of a pod, and nothing else."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    return {"metadata": {
        "namespace": meta.get("namespace"), "name": meta.get("name"),
        "deletionTimestamp": meta.get("deletionTimestamp"),
        "labels": {k: v for k, v in labels.items() if k == LABEL_WRITER},
        "annotations": {k: v for k, v in notes.items() if k == ANNOTATION_POLICY}},
        "status": {"phase": status.get("phase")}}


def _filed(pod: Mapping[str, Any]) -> tuple[PodKey, Slot | None, bool]:
    """(the pod's key, its slot or None, live): live is not being deleted and
    not Succeeded or Failed, as kube.live_writers counts it."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    key = (meta.get("namespace") or "", meta.get("name") or "")
    label = (meta.get("labels") or {}).get(LABEL_WRITER)
    policy = (meta.get("annotations") or {}).get(ANNOTATION_POLICY)
    if not (isinstance(label, str) and label.isascii() and label.isdigit()
            and isinstance(policy, str) and policy):
        return key, None, False
    live = not meta.get("deletionTimestamp") and status.get("phase") not in (
        "Succeeded", "Failed")
    return key, (key[0], policy, int(label)), live


class HolderMirror:
    """Writer pods by slot; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slots: dict[Slot, dict[str, bool]] = {}
        self._where: dict[PodKey, Slot] = {}
        self._current = False
        self._version = ""

    def holders_of(self, namespace: str, policy: str) -> Callable[[int], list[str]] | None:
        """`rank` → the live pods holding it, for admission; None while the
        view is not current (admission then asks the apiserver)."""
        with self._lock:
            if not self._current:
                return None

        def holders(rank: int) -> list[str]:
            with self._lock:
                if not self._current:  # lost since: the fresh read decides
                    return ["(the view of writer pods is not current)"]
                found = self._slots.get((namespace, policy, rank), {})
                return sorted(name for name, live in found.items() if live)
        return holders

    @property
    def current(self) -> bool:
        with self._lock:
            return self._current

    @property
    def version(self) -> str:
        with self._lock:
            return self._version

    def replace(self, items: list[dict[str, Any]], version: str) -> None:
        with self._lock:
            self._slots.clear()
            self._where.clear()
            for pod in items:
                self._file(pod)
            self._version = version
            self._current = True

    def apply(self, kind: str, pod: dict[str, Any]) -> None:
        version = (pod.get("metadata") or {}).get("resourceVersion") or ""
        with self._lock:
            if kind in ("ADDED", "MODIFIED"):
                self._file(pod)
            elif kind == "DELETED":
                self._unfile(_filed(pod)[0])
            if version:
                self._version = version

    def lost(self) -> None:
        with self._lock:
            self._current = False

    def _file(self, pod: Mapping[str, Any]) -> None:
        key, slot, live = _filed(pod)
        self._unfile(key)
        if slot is None:
            return
        self._slots.setdefault(slot, {})[key[1]] = live
        self._where[key] = slot

    def _unfile(self, key: PodKey) -> None:
        slot = self._where.pop(key, None)
        if slot is None:
            return
        found = self._slots.get(slot, {})
        found.pop(key[1], None)
        if not found:
            self._slots.pop(slot, None)


def _path(namespace: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods" if namespace \
        else "/api/v1/pods"


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    pending = b""
    for chunk in chunks:
        pending += chunk
        *whole, pending = pending.split(b"\n")
        yield from (line for line in whole if line.strip())
    if pending.strip():
        yield pending


def start(mirror: HolderMirror, namespace: str, logger: logging.Logger,
          stopping: threading.Event) -> threading.Thread:
    """Keep `mirror` in step with the apiserver in a daemon thread: list the
    writer pods, watch from the list's resourceVersion, list again after any
    failure (a 410 Gone included)."""
    from ckptdrain.operator import kube

    selector = [("labelSelector", LABEL_WRITER)]

    def list_all() -> tuple[list[dict[str, Any]], str]:
        # In pages, each pod cut down as it comes: thousands of whole pods
        # decoded at once would be the process's largest memory by far.
        kept: list[dict[str, Any]] = []
        token = ""
        while True:
            found = kube._get_json(_path(namespace), [
                *selector, ("limit", str(PAGE)), *([("continue", token)] if token else [])],
                60)
            kept.extend(_slim(pod) for pod in found.get("items") or [])
            token = (found.get("metadata") or {}).get("continue") or ""
            if not token:
                return kept, found["metadata"]["resourceVersion"]

    def watch_once() -> None:
        response = kube._stream(_path(namespace), [
            *selector, ("watch", "true"), ("resourceVersion", mirror.version),
            ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(WATCH_S))], WATCH_S + 30)
        try:
            for line in _lines(response.stream(1 << 16)):
                if stopping.is_set():
                    return
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object")
                if kind == "ERROR" or not isinstance(obj, dict):
                    raise RuntimeError(f"watch of writer pods ended: {obj}")
                mirror.apply(kind, obj)
        finally:
            response.release_conn()

    def run() -> None:
        failures = 0
        while not stopping.is_set():
            try:
                if not mirror.current:
                    items, version = list_all()
                    mirror.replace(items, version)
                    logger.info("admission: %d writer pods in view", len(items))
                watch_once()
                failures = 0
            except Exception as error:  # any failure: relist, never a stale view
                mirror.lost()
                delay = RETRY_S[min(failures, len(RETRY_S) - 1)]
                failures += 1
                logger.warning("admission: the view of writer pods is not current (%s); "
                               "the apiserver is asked meanwhile; retrying in %.1fs",
                               error, delay)
                stopping.wait(delay)

    thread = threading.Thread(target=run, name="ckptdrain-holder-mirror", daemon=True)
    thread.start()
    return thread
