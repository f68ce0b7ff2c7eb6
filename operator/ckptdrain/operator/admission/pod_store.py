"""What the pod census knows of the live opted-in pods: its one store, kept
by pod events and corrected by a LIST now and then. Pure: no Kubernetes,
the clock is passed in.

A watch hears of a deleted pod only through its DELETED event. A replica
that stood by (paused under peering) or re-listed after its watch expired
never hears of the pods deleted meanwhile, so a store kept by events alone
keeps them for ever: a policy would read Unprotected for a pod long gone.
`reconcile` drops every pod a fresh LIST does not hold, unless an event
recorded it after the LIST began (a pod created during the LIST).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from ckptdrain.operator.admission.protection import PodView, continued

#: A pod as the apiserver names it: (namespace, name).
PodKey = tuple[str, str]


@dataclass(frozen=True)
class _Entry:
    view: PodView
    #: When an event recorded this view (the store's clock, monotonic).
    seen_at: float


def _older(seen: PodView, kept: PodView) -> bool:
    """Whether `seen` is another pod of the same name created before `kept`."""
    return bool(seen.uid and kept.uid and seen.uid != kept.uid and seen.created
                and kept.created and seen.created < kept.created)


class PodStore:
    """The census's view of each live opted-in pod, by namespace and name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, dict[str, _Entry]] = {}

    def see(self, namespace: str, name: str, view: PodView | None, at: float,
            uid: str = "") -> bool:
        """Record what an event says of a pod (None: gone, finished or
        departing; `uid` says which pod); True when it changed what the
        census sees. A pod's replacement of the same name (a StatefulSet's)
        may be heard of before the old pod's deletion or last update: neither
        changes what is kept of the replacement."""
        with self._lock:
            pods = self._pods.get(namespace, {})
            entry = pods.get(name)
            if view is None:
                if entry is None or (uid and entry.view.uid and entry.view.uid != uid):
                    return False
                del pods[name]
                if not pods:
                    del self._pods[namespace]
                return True
            if entry is not None and _older(view, entry.view):
                # The old pod's late update, heard after its same-named
                # replacement: the replacement stays.
                return False
            # A crash loop's outage began at its first exit (protection.py).
            view = continued(entry.view if entry else None, view)
            self._pods.setdefault(namespace, {})[name] = _Entry(view, at)
            return entry is None or entry.view != view

    def views(self, namespace: str) -> list[PodView]:
        """The live opted-in pods of `namespace`."""
        with self._lock:
            return [e.view for e in self._pods.get(namespace, {}).values()]

    def namespaces(self) -> set[str]:
        with self._lock:
            return set(self._pods)

    def reconcile(self, listed: Iterable[PodKey], list_started: float,
                  scope: str | None = None) -> set[PodKey]:
        """Drop every pod (of namespace `scope`; None: all) that a LIST begun
        at `list_started` does not hold and that no event recorded since it
        began; returns the pods dropped."""
        present = set(listed)
        dropped: set[PodKey] = set()
        with self._lock:
            for namespace in [scope] if scope is not None else list(self._pods):
                pods = self._pods.get(namespace, {})
                for name, entry in list(pods.items()):
                    if (namespace, name) not in present and entry.seen_at < list_started:
                        del pods[name]
                        dropped.add((namespace, name))
                if not pods:
                    self._pods.pop(namespace, None)
        return dropped

    def clear(self) -> None:
        with self._lock:
            self._pods.clear()
