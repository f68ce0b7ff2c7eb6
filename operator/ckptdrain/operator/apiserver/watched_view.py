"""What the admission process's own views of the cluster share
(admission/policy_mirror.py, admission/holder_mirror.py): a thread-safe view that is current
only from a list until a watch fails, and the thread that keeps it so: list,
watch from the list's resourceVersion, list again after any failure (a 410
Gone included). Never a stale view: while it is not current, admission asks
the apiserver instead.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any


class WatchedView:
    """The list-and-watch bookkeeping; subclasses file what they keep
    (`_clear`, `_file`, `_forget`, called with the lock held)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current = False
        self._version = ""

    @property
    def current(self) -> bool:
        with self._lock:
            return self._current

    @property
    def version(self) -> str:
        with self._lock:
            return self._version

    def replace(self, items: list[dict[str, Any]], version: str) -> None:
        """A fresh list: the view becomes exactly `items`, and current."""
        with self._lock:
            self._clear()
            for item in items:
                self._file(item)
            self._version = version
            self._current = True
            self._touched()

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED, BOOKMARK)."""
        version = (obj.get("metadata") or {}).get("resourceVersion") or ""
        with self._lock:
            self._touched()
            if kind in ("ADDED", "MODIFIED"):
                self._file(obj)
            elif kind == "DELETED":
                self._forget(obj)
            if version:
                self._version = version

    def lost(self) -> None:
        """The watch failed: offer nothing until the next list."""
        with self._lock:
            self._current = False

    def _clear(self) -> None:
        raise NotImplementedError

    def _file(self, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    def _forget(self, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    def _touched(self) -> None:
        """The apiserver was heard from (a list or an event)."""


def follow(events: Iterable[Mapping[str, Any]], view: WatchedView, what: str,
           stopping: threading.Event) -> None:
    """Apply watch `events` to `view` until they end or `stopping`; an ERROR
    event (a 410 Gone) raises, so that the view is listed again."""
    for event in events:
        if stopping.is_set():
            return
        kind, obj = event.get("type"), event.get("object")
        if kind == "ERROR" or not isinstance(obj, dict):
            raise RuntimeError(f"watch of {what} ended: {obj}")
        view.apply(str(kind), obj)


def keep_in_step(view: WatchedView, what: str,
                 list_all: Callable[[], tuple[list[dict[str, Any]], str]],
                 watch_once: Callable[[], None], logger: logging.Logger,
                 stopping: threading.Event, retry: tuple[float, ...], thread_name: str, *,
                 jitter: bool = False, shortest_watch_s: float = 0.0) -> threading.Thread:
    """Keep `view` in step with the apiserver in a daemon thread. After a
    failure, wait `retry[n]` (the last one from then on; ±20% with
    `jitter`); after a watch that ended sooner than `shortest_watch_s`,
    pause that long (no tight loop)."""

    def run() -> None:
        failures = 0
        while not stopping.is_set():
            try:
                if not view.current:
                    items, version = list_all()
                    view.replace(items, version)
                    logger.info("admission: %d %s in view", len(items), what)
                began = time.monotonic()
                watch_once()
                failures = 0
                if time.monotonic() - began < shortest_watch_s:
                    stopping.wait(shortest_watch_s)
            except Exception as error:  # any failure: relist, never a stale view
                view.lost()
                delay = retry[min(failures, len(retry) - 1)]
                if jitter:
                    delay *= random.uniform(0.8, 1.2)
                failures += 1
                logger.warning("admission: the view of %s is not current (%s); the apiserver "
                               "is asked meanwhile; retrying in %.1fs", what, error, delay)
                stopping.wait(delay)

    thread = threading.Thread(target=run, name=thread_name, daemon=True)
    thread.start()
    return thread
