"""Run a pass soon, once, however many events ask for it.

Kopf calls a handler per event; at thousands of writers one checkpoint is
thousands of events on a few objects. A handler that only *schedules* the
pass for its key turns N events within the delay into one pass over the
latest state (the indexes are live views), so the work and the writes of a
burst do not grow with its length. A pass that fails (an API error, a broken
connection, an index that changed while read) is retried after
`retry_delay`: a timer thread has no one to raise to.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable


class Coalescer:
    """One pending run per key. A later ask that is due sooner than the one
    pending brings it forward (a 10 s heartbeat never delays a pod event's
    0.5 s pass); any other later ask is absorbed."""

    def __init__(self, name: str, retry_delay: float = 5.0) -> None:
        self.name = name
        self.retry_delay = retry_delay
        self._pending: dict[Hashable, tuple[threading.Timer, float]] = {}
        self._lock = threading.Lock()

    def schedule(self, key: Hashable, run: Callable[[], None], logger: logging.Logger,
                 delay: float) -> bool:
        """Run `run()` in `delay` seconds unless a run for `key` is already due
        by then; True when this call scheduled (or brought forward) one."""
        due = time.monotonic() + delay
        with self._lock:
            pending = self._pending.get(key)
            if pending is not None:
                if pending[1] <= due:
                    return False
                pending[0].cancel()  # too late if it already fired: then it is gone below

            def go() -> None:
                with self._lock:
                    if self._pending.get(key, (None, 0.0))[0] is not timer:
                        return  # brought forward: another timer runs it
                    del self._pending[key]
                try:
                    run()
                except Exception as error:
                    logger.warning("%s of %s failed (%s); retrying in %ss", self.name, key,
                                   error, self.retry_delay)
                    self.schedule(key, run, logger, self.retry_delay)

            timer = threading.Timer(delay, go)
            timer.daemon = True
            self._pending[key] = (timer, due)
        timer.start()
        return True
