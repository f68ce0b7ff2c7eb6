"""The admission process's own view of which pods hold which writer rank: one
list, then a watch, of the pods labelled `ckptdrain.io/writer` (the few the
webhook injected with a rank), kept by a thread and filed by (namespace,
policy, rank). Admission looks a rank's holders up here with no API call;
it asked the apiserver twice per admission before, and under load those two
reads were most of an admission's time.

The view only ever shortens the way to a refusal, never to an admission
that would otherwise be refused: a holder it names is confirmed by a fresh
read before a pod is refused (admission.pod_role), and until the
first list, or from a failed watch until the next list succeeds,
`holders_of` answers None and admission asks the apiserver as before. A
holder admitted a moment ago may not be in the view yet; the apiserver's
watch cache, which admission read before, lags in the same way (one step
less), and the operator's DuplicateWriter condition is the backstop for a
rank claimed twice at the same instant.

Only a few fields of each pod are kept (name, rank, policy, live or not,
and what agent_pin.py reads: the workload's generation and the agent image):
the watch decodes each pod and keeps no more. The same view tells admission
which agent image the other live writers of a policy's workload run
(`running`), counted as events come, so that an admission reads a few
numbers, not every writer of a large job.

Two more guards keep a lagging view from admitting a rank twice:
- a view that has heard nothing from the apiserver (an event, a bookmark,
  about one a minute, or a new connection) for FRESH_S is not offered: a
  half-open watch connection does not answer "no holder" for minutes;
- a rank this process admitted in the last CLAIM_S counts as held until the
  pod's own event is seen (its name unknown yet with generateName), so a
  second pod for it is checked by a fresh read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from ckptdrain.contract.api import (
    ANNOTATION_AGENT_IMAGE,
    ANNOTATION_INJECTED,
    ANNOTATION_POLICY,
    LABEL_INJECT,
    LABEL_WRITER,
)
from ckptdrain.operator.admission import agent_pin
from ckptdrain.operator.apiserver.watched_view import WatchedView, follow, keep_in_step

#: (namespace, policy, rank) → {pod name: live}
Slot = tuple[str, str, int]
PodKey = tuple[str, str]
WATCH_S = 300
#: Connect, and per-read, timeouts of the watch: bookmarks come about once a minute.
WATCH_TIMEOUT = (10.0, 90.0)
#: A view that heard nothing for this long is not offered.
FRESH_S = 90.0
#: How long a rank admitted here counts as held without its pod's event.
CLAIM_S = 30.0
RETRY_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
#: A watch that ended sooner than this is followed by a pause (no tight loop).
SHORTEST_WATCH_S = 1.0
WHAT = "writer pods"
#: Pods per page of the first list.
PAGE = 500


_LABELS = frozenset((LABEL_WRITER, LABEL_INJECT, *agent_pin.GENERATION_LABELS))
_ANNOTATIONS = frozenset((ANNOTATION_POLICY, ANNOTATION_AGENT_IMAGE, ANNOTATION_INJECTED,
                          *agent_pin.GENERATION_LABELS))


def _slim(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What _filed reads of a pod, and nothing else."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    return {"metadata": {
        "namespace": meta.get("namespace"), "name": meta.get("name"),
        "deletionTimestamp": meta.get("deletionTimestamp"),
        "labels": {k: v for k, v in labels.items() if k in _LABELS},
        "annotations": {k: v for k, v in notes.items() if k in _ANNOTATIONS},
        "ownerReferences": [{"kind": o.get("kind"), "uid": o.get("uid"), "controller": True}
                            for o in meta.get("ownerReferences") or []
                            if isinstance(o, Mapping) and o.get("controller") is True]},
        "status": {"phase": status.get("phase")}}


def _filed(pod: Mapping[str, Any]) -> tuple[PodKey, Slot | None, bool]:
    """(the pod's key, its slot or None, live): live is not being deleted and
    not Succeeded or Failed, as reads.live_writers counts it."""
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


class HolderMirror(WatchedView):
    """Writer pods by slot; thread-safe."""

    def __init__(self, namespace: str = "", clock: Callable[[], float] = time.monotonic
                 ) -> None:
        super().__init__()
        self._slots: dict[Slot, dict[str, bool]] = {}
        #: (namespace, policy, generation) → image → live writers running it,
        #: and where each live writer is counted.
        self._running: dict[tuple[str, str, str], dict[str, int]] = {}
        self._counted: dict[PodKey, tuple[tuple[str, str, str], str]] = {}
        self._where: dict[PodKey, Slot] = {}
        self._claims: dict[Slot, float] = {}
        self._heard = -float("inf")
        #: The one namespace watched ("" for all): elsewhere the view knows nothing.
        self.namespace = namespace
        self._clock = clock

    def _offered(self, namespace: str) -> bool:
        return (self._current and self._clock() - self._heard < FRESH_S
                and bool(namespace) and self.namespace in ("", namespace))

    def holders_of(self, namespace: str, policy: str) -> Callable[[int], list[str]] | None:
        """`rank` → the live pods holding it, for admission; None while the
        view is not current or not fresh, or does not cover `namespace`
        (admission then asks the apiserver)."""
        with self._lock:
            if not self._offered(namespace):
                return None

        def holders(rank: int) -> list[str]:
            slot = (namespace, policy, rank)
            with self._lock:
                if not self._offered(namespace):  # lost since: the fresh read decides
                    return ["(the view of writer pods is not current)"]
                found = sorted(name for name, live in self._slots.get(slot, {}).items()
                               if live)
                claimed = self._claims.get(slot)
                if claimed is not None and self._clock() - claimed < CLAIM_S:
                    found.append("(admitted here a moment ago)")
                return found
        return holders

    def running(self, namespace: str, policy: str, generation: str, me: str
                ) -> dict[str, int] | None:
        """image → the live writers of `policy` of `generation` running it
        (pod `me` not counted), for agent_pin.choose; None while the view is
        not current or fresh, or does not cover `namespace`."""
        with self._lock:
            if not self._offered(namespace):
                return None
            counts = dict(self._running.get((namespace, policy, generation), {}))
            mine = self._counted.get((namespace, me))
            if mine is not None and mine[0] == (namespace, policy, generation):
                counts[mine[1]] -= 1
            return {image: n for image, n in counts.items() if n > 0}

    def claimed(self, namespace: str, policy: str, rank: int) -> None:
        """This process admitted a pod for the rank: held until its event comes."""
        with self._lock:
            now = self._clock()
            self._claims = {k: t for k, t in self._claims.items() if now - t < CLAIM_S}
            self._claims[(namespace, policy, rank)] = now

    def heard(self) -> None:
        """The apiserver answered (a new watch connection)."""
        with self._lock:
            self._touched()

    # -- what the watch feeds it (apiserver/watched_view.py) ----------------------------

    def _touched(self) -> None:
        self._heard = self._clock()

    def _clear(self) -> None:
        self._slots.clear()
        self._where.clear()
        self._running.clear()
        self._counted.clear()

    def _forget(self, obj: dict[str, Any]) -> None:
        self._unfile(_filed(obj)[0])

    def _file(self, pod: dict[str, Any]) -> None:
        key, slot, live = _filed(pod)
        self._unfile(key)
        if slot is None:
            return
        self._slots.setdefault(slot, {})[key[1]] = live
        self._where[key] = slot
        found = agent_pin.sibling(pod)
        if live and found.generation is not None and found.image:
            where = (slot[0], slot[1], found.generation)
            images = self._running.setdefault(where, {})
            images[found.image] = images.get(found.image, 0) + 1
            self._counted[key] = (where, found.image)
        self._claims.pop(slot, None)  # its pod is seen: the view knows it now

    def _unfile(self, key: PodKey) -> None:
        counted = self._counted.pop(key, None)
        if counted is not None:
            images = self._running[counted[0]]
            images[counted[1]] -= 1
            if images[counted[1]] <= 0:
                del images[counted[1]]
            if not images:
                del self._running[counted[0]]
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


def start(mirror: HolderMirror, namespace: str, logger: logging.Logger,
          stopping: threading.Event) -> threading.Thread:
    """Keep `mirror` in step with the apiserver in a daemon thread: list the
    writer pods, watch from the list's resourceVersion, list again after any
    failure (a 410 Gone included)."""
    from ckptdrain.operator.apiserver import reads

    selector = [("labelSelector", LABEL_WRITER)]

    def list_all() -> tuple[list[dict[str, Any]], str]:
        # In pages, each pod cut down as it comes: thousands of whole pods
        # decoded at once would be the process's largest memory by far.
        kept: list[dict[str, Any]] = []
        token = ""
        while True:
            found = reads.get_json(_path(namespace), [
                *selector, ("limit", str(PAGE)), *([("continue", token)] if token else [])],
                60)
            kept.extend(_slim(pod) for pod in found.get("items") or [])
            token = (found.get("metadata") or {}).get("continue") or ""
            if not token:
                return kept, found["metadata"]["resourceVersion"]

    def watch_once() -> None:
        with reads.watching(_path(namespace), selector, mirror.version, WATCH_S,
                            WATCH_TIMEOUT) as events:
            mirror.heard()
            follow(events, mirror, WHAT, stopping)

    return keep_in_step(mirror, WHAT, list_all, watch_once, logger, stopping, RETRY_S,
                        "ckptdrain-holder-mirror", jitter=True,
                        shortest_watch_s=SHORTEST_WATCH_S)
