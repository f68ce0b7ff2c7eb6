"""The CheckpointClasses as a process sees them: one list, then a watch from
its resourceVersion, kept by a thread (apiserver/watched_view.py), and what
a caller makes of their bodies (policy/classes.py catalogue), made once per
change, with no API call.

The operator and the admission process each keep one (`CLASSES`), started
at their start. While it is not current (before the first list, after a
failed watch) `current()` lists the classes itself, so a policy is never
judged against a stale view. Where the CheckpointClass CRD is not installed
(an older chart's CRDs) there are no classes: every policy keeps the
operator's own settings, as before classes existed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ckptdrain.contract.api import GROUP
from ckptdrain.operator.apiserver.slim import without_managed_fields
from ckptdrain.operator.apiserver.watched_view import WatchedView, follow, keep_in_step

T = TypeVar("T")
PATH = f"/apis/{GROUP}/v1beta1/checkpointclasses"
WATCH_S = 300
RETRY_S = (0.5, 1.0, 2.0, 5.0, 30.0)
WHAT = "CheckpointClasses"
#: A list made inside a request (admission, a reconcile): short.
LIST_TIMEOUT_S = 3.0


class ClassView(WatchedView):
    """Class bodies by name, and what was last made of them; thread-safe."""

    def __init__(self) -> None:
        super().__init__()
        self._bodies: dict[str, dict[str, Any]] = {}
        #: What each `make` made of the bodies since the last change.
        self._made: dict[Callable[..., Any], Any] = {}

    def made(self, make: Callable[[list[dict[str, Any]]], T]) -> T | None:
        """`make(bodies)`, made again only after a change; None while the
        view is not current."""
        with self._lock:
            if not self._current:
                return None
            if make not in self._made:
                self._made[make] = make(list(self._bodies.values()))
            return self._made[make]

    def _clear(self) -> None:
        self._bodies.clear()
        self._made.clear()

    def _file(self, obj: dict[str, Any]) -> None:
        self._bodies[_name(obj)] = without_managed_fields(obj)
        self._made.clear()

    def _forget(self, obj: dict[str, Any]) -> None:
        self._bodies.pop(_name(obj), None)
        self._made.clear()


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


#: This process's view.
CLASSES = ClassView()


def _list(timeout: float) -> tuple[list[dict[str, Any]], str]:
    from ckptdrain.operator.apiserver import reads

    try:
        found = reads.get_json(PATH, [], timeout)
    except reads.ApiError as error:
        if error.status == 404:  # no CheckpointClass CRD: no classes
            return [], ""
        raise
    return list(found.get("items") or []), str((found.get("metadata") or {})
                                               .get("resourceVersion") or "")


def current(make: Callable[[list[dict[str, Any]]], T], view: ClassView = CLASSES) -> T:
    """`make` of the classes now: the view's, or listed when it is not
    current. Raises the read's error when the apiserver does not answer."""
    made = view.made(make)
    if made is not None:
        return made
    items, _ = _list(LIST_TIMEOUT_S)
    return make(items)


def start(logger: logging.Logger, view: ClassView = CLASSES,
          stopping: threading.Event | None = None) -> threading.Thread:
    """Keep `view` in step with the apiserver in a daemon thread."""
    stopping = threading.Event() if stopping is None else stopping
    from ckptdrain.operator.apiserver import reads

    def list_all() -> tuple[list[dict[str, Any]], str]:
        items, version = _list(60)
        if not version:
            # No CRD yet: nothing to watch; look again later (a chart
            # upgrade installs it). Meanwhile the view is not current, and
            # each judgement lists (no CRD: no class) rather than trust an
            # empty view past the CRD's arrival.
            raise RuntimeError("the CheckpointClass CRD is not installed")
        return items, version

    def watch_once() -> None:
        with reads.watching(PATH, [], view.version, WATCH_S, (10, WATCH_S + 30)) as events:
            follow(events, view, WHAT, stopping)

    return keep_in_step(view, WHAT, list_all, watch_once, logger, stopping, RETRY_S,
                        "ckptdrain-class-view")
