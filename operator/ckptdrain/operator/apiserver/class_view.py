"""The CheckpointClasses as a process sees them: one list, then a watch from
its resourceVersion, kept by a thread (apiserver/watched_view.py), and what
a caller makes of their bodies (policy/classes.py catalogue), made once per
change, with no API call.

The operator and the admission process each keep one (`CLASSES`), started
at their start. While it is not current (before the first list, after a
failed watch) `current()` lists the classes itself, so a policy is never
judged against a stale view. Where the CheckpointClass CRD is not installed
(an older chart's CRDs, CRDs applied by hand and lagging) there are no
classes: every policy keeps the operator's own settings, as before classes
existed. That answer (a 404, or a 403 from RBAC that lags the same way) is
current and empty, kept for CRD_RECHECK_S: judgements do not list classes
each time, and the CRD is looked for again at that interval, said once in
the log when it goes and once when it comes.
"""

from __future__ import annotations

import logging
import threading
import time
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
#: How long "no CheckpointClass CRD" stands before it is asked again.
CRD_RECHECK_S = 60.0
#: Answers to a list that mean the CRD cannot be read at all: not there
#: (404), or not yet readable by us (403: the chart's RBAC not applied).
ABSENT_STATUSES = (404, 403)


class ClassView(WatchedView):
    """Class bodies by name, and what was last made of them; thread-safe."""

    def __init__(self) -> None:
        super().__init__()
        self._bodies: dict[str, dict[str, Any]] = {}
        #: What each `make` made of the bodies since the last change.
        self._made: dict[Callable[..., Any], Any] = {}
        #: When "no CRD" stops standing (monotonic); None while the CRD is there.
        self._absent_until: float | None = None

    @property
    def absent(self) -> bool:
        """The last list found no CheckpointClass CRD."""
        with self._lock:
            return self._absent_until is not None

    def mark_absent(self, now: float | None = None) -> bool:
        """No CRD: current and empty until CRD_RECHECK_S from `now`. True
        when the CRD was there (or unknown) before: the caller says so once."""
        at = time.monotonic() if now is None else now
        with self._lock:
            was = self._absent_until is not None
        self.replace([], "")
        with self._lock:
            self._absent_until = at + CRD_RECHECK_S
        return not was

    def made(self, make: Callable[[list[dict[str, Any]]], T]) -> T | None:
        """`make(bodies)`, made again only after a change; None while the
        view is not current (or "no CRD" is due to be asked again)."""
        with self._lock:
            if not self._current:
                return None
            if self._absent_until is not None and time.monotonic() >= self._absent_until:
                return None
            if make not in self._made:
                self._made[make] = make(list(self._bodies.values()))
            return self._made[make]

    def replace(self, items: list[dict[str, Any]], version: str) -> None:
        with self._lock:
            self._absent_until = None
        super().replace(items, version)

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        """One event; an event older than the body the view holds (an event
        of the operator's own watch arriving after its newer list) is
        skipped. An event while "no CRD" stands means the CRD came: the
        view lists again before it is trusted."""
        with self._lock:
            if self._absent_until is not None:
                self._absent_until, self._current = None, False
            held = self._bodies.get(_name(obj))
        if kind != "DELETED" and held is not None and _older(obj, held):
            return
        super().apply(kind, obj)

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


def _older(obj: dict[str, Any], held: dict[str, Any]) -> bool:
    """`obj`'s resourceVersion is below `held`'s. Versions are opaque by
    contract; compared only where both are whole numbers (etcd's are)."""
    new = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    old = str((held.get("metadata") or {}).get("resourceVersion") or "")
    return new.isdigit() and old.isdigit() and int(new) < int(old)


#: This process's view.
CLASSES = ClassView()


def _list(timeout: float) -> tuple[list[dict[str, Any]], str] | None:
    """The classes and the list's resourceVersion; None when there is no
    CRD to list (ABSENT_STATUSES)."""
    from ckptdrain.operator.apiserver import reads

    try:
        found = reads.get_json(PATH, [], timeout)
    except reads.ApiError as error:
        if error.status in ABSENT_STATUSES:
            return None
        raise
    return list(found.get("items") or []), str((found.get("metadata") or {})
                                               .get("resourceVersion") or "")


def _say_absent(logger: logging.Logger, view: ClassView) -> None:
    """Mark `view` absent; log it only when it was not already."""
    if view.mark_absent():
        logger.error("the CheckpointClass CRD cannot be read (not installed, or no RBAC to "
                     "list checkpointclasses): no class applies, every policy keeps the "
                     "operator's own settings; looking again every %.0fs", CRD_RECHECK_S)


def current(make: Callable[[list[dict[str, Any]]], T], view: ClassView = CLASSES,
            timeout: float = LIST_TIMEOUT_S) -> T:
    """`make` of the classes now: the view's, or listed when it is not
    current (a list that finds no CRD is kept as current and empty).
    Raises the read's error when the apiserver does not answer."""
    made = view.made(make)
    if made is not None:
        return made
    listed = _list(max(0.1, timeout))
    if listed is None:
        _say_absent(logging.getLogger(__name__), view)
        made = view.made(make)
        return made if made is not None else make([])
    if view.absent:  # the CRD came: the view's thread lists and watches it
        view.lost()
    return make(listed[0])


def start(logger: logging.Logger, view: ClassView = CLASSES,
          stopping: threading.Event | None = None) -> threading.Thread:
    """Keep `view` in step with the apiserver in a daemon thread."""
    stopping = threading.Event() if stopping is None else stopping
    from ckptdrain.operator.apiserver import reads

    def list_all() -> tuple[list[dict[str, Any]], str]:
        listed = _list(60)
        while listed is None and not stopping.is_set():
            # No CRD: nothing to watch. Current and empty until the next
            # look (a chart upgrade installs it); said once, not each time.
            _say_absent(logger, view)
            stopping.wait(CRD_RECHECK_S)
            listed = _list(60)
        if listed is None:
            return [], ""
        if view.absent:
            logger.info("the CheckpointClass CRD is installed: classes apply")
        return listed

    def watch_once() -> None:
        if not view.version:  # stopping while no CRD
            return
        with reads.watching(PATH, [], view.version, WATCH_S, (10, WATCH_S + 30)) as events:
            follow(events, view, WHAT, stopping)

    return keep_in_step(view, WHAT, list_all, watch_once, logger, stopping, RETRY_S,
                        "ckptdrain-class-view")
