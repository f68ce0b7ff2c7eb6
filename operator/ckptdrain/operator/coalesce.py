"""Run a pass soon, once, however many events ask for it.

Kopf calls a handler per event; at thousands of writers one checkpoint is
thousands of events on a few objects. A handler that only *schedules* the
pass for its key turns N events within the delay into one pass over the
latest state (the indexes are live views), so the work and the writes of a
burst do not grow with its length. A pass that fails (an API error, a broken
connection, an index that changed while read) is retried after
`retry_delay`: a worker thread has no one to raise to.

The passes run on a few worker threads per coalescer, never a thread per
key: with a thousand policies due at once, a thread each would run a
thousand passes side by side, each holding its own copies of what it read,
and starve the admission webhook of the interpreter. One key's passes never
overlap: a pass asked for while one runs waits for it to end.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

#: Worker threads per coalescer: passes mostly wait on the apiserver, so a
#: few overlap their waits; more would only contend for the interpreter.
WORKERS = 4


@dataclass
class _Ask:
    due: float
    seq: int
    run: Callable[[], None]
    logger: logging.Logger


class Coalescer:
    """One pending run per key. A later ask that is due sooner than the one
    pending brings it forward (a 10 s heartbeat never delays a pod event's
    0.5 s pass); any other later ask is absorbed, but its `run` replaces the
    pending one (the newer closure reads the same live state)."""

    def __init__(self, name: str, retry_delay: float = 5.0, workers: int = WORKERS) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.name = name
        self.retry_delay = retry_delay
        self._workers = workers
        self._asks: dict[Hashable, _Ask] = {}
        #: (due, seq, key); an entry whose seq is not its key's pending ask is stale.
        self._heap: list[tuple[float, int, Hashable]] = []
        self._running: set[Hashable] = set()
        #: Due while running: put back on the heap when its pass ends.
        self._held: set[Hashable] = set()
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []

    def schedule(self, key: Hashable, run: Callable[[], None], logger: logging.Logger,
                 delay: float) -> bool:
        """Run `run()` in `delay` seconds unless a run for `key` is already due
        by then; True when this call scheduled (or brought forward) one."""
        due = time.monotonic() + delay
        with self._cond:
            pending = self._asks.get(key)
            if pending is not None and pending.due <= due:
                pending.run, pending.logger = run, logger
                return False
            ask = _Ask(due, next(self._seq), run, logger)
            self._asks[key] = ask
            if key not in self._held:
                heapq.heappush(self._heap, (due, ask.seq, key))
            self._start_workers()
            self._cond.notify()
        return True

    def pending(self) -> int:
        """Keys waiting for a pass (not counting those running)."""
        with self._cond:
            return len(self._asks)

    def _start_workers(self) -> None:
        while len(self._threads) < self._workers:
            thread = threading.Thread(target=self._work, daemon=True,
                                      name=f"ckptdrain-{self.name}-{len(self._threads)}")
            self._threads.append(thread)
            thread.start()

    def _next(self) -> tuple[Hashable, _Ask]:
        """Wait for the earliest due key that is not running; claim it."""
        with self._cond:
            while True:
                while self._heap:
                    _, seq, key = self._heap[0]
                    ask = self._asks.get(key)
                    if ask is None or ask.seq != seq:
                        heapq.heappop(self._heap)  # brought forward or already taken
                        continue
                    if key in self._running:
                        heapq.heappop(self._heap)
                        self._held.add(key)  # back on the heap when its pass ends
                        continue
                    break
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                _, _, key = heapq.heappop(self._heap)
                ask = self._asks.pop(key)
                self._running.add(key)
                return key, ask

    def _work(self) -> None:
        while True:
            key, ask = self._next()
            try:
                ask.run()
                failed = None
            except BaseException as error:  # a worker that died would wedge its key
                failed = error
            with self._cond:
                self._running.discard(key)
                if key in self._held:
                    self._held.discard(key)
                    held = self._asks.get(key)
                    if held is not None:
                        heapq.heappush(self._heap, (held.due, held.seq, key))
                        self._cond.notify()
            if failed is not None:
                ask.logger.warning("%s of %s failed (%s); retrying in %ss", self.name, key,
                                   failed, self.retry_delay)
                self.schedule(key, ask.run, ask.logger, self.retry_delay)


def drop_handled(pending: dict[Hashable, dict[Any, Any]], key: Hashable,
                 handled: dict[Any, Any]) -> None:
    """After a pass: remove from `pending[key]` what it handled, unless an
    event replaced an entry meanwhile (compared by identity: that one waits
    for the next pass). The caller holds the lock that guards `pending`."""
    left = pending.get(key) or {}
    for name, entry in handled.items():
        if left.get(name) is entry:
            del left[name]
    if not left:
        pending.pop(key, None)
