"""The trainer's progress, as the client sees it: the goodput facts only the
training process knows. Standard library only (imported by client.py).

`<work>/.ckptdrain/progress` (JSON, replaced atomically) holds, for this
process:

    {"pid": 7, "startedAt": 1700000000.0,   when the client was made
     "trainingAt": 1700000003.2,            first step done (training again)
     "firstStep": 43, "step": 57,            first and newest step done
     "stepSeconds": 0.5,                     mean seconds per step so far
     "blockedSeconds": 1.9, "saves": 3,      time inside begin()..complete()
     "completed": {"50": 1700000010.1},      newest MAX_COMPLETED saves, when
     "interruptedAt": null}                  SIGTERM, when it arrived

It is written at the first step, at each save and on SIGTERM: a few small
local writes per checkpoint, never per step. The agent reads it (the
trainer never talks to the API server).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROGRESS_FILE = "progress"
MAX_COMPLETED = 16


class Progress:
    def __init__(self, path: Path, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 write: Callable[[Path, dict[str, Any]], None] | None = None) -> None:
        self.path, self.clock, self.monotonic = path, clock, monotonic
        self._write = write
        # Reentrant: Client.on_preemption's SIGTERM handler runs in the main
        # thread between bytecodes, possibly while that thread is inside one of
        # these methods (step_done takes the lock every step); a plain lock
        # would make the handler wait for itself forever, and the pod would
        # lose its emergency checkpoint to the grace period's SIGKILL.
        self._lock = threading.RLock()
        self.started_at = clock()
        self.training_at: float | None = None
        self.first_step: int | None = None
        self.step: int | None = None
        self._first_mono: float | None = None
        self._last_mono: float | None = None
        self.blocked_s = 0.0
        self.saves = 0
        self.completed: dict[int, float] = {}
        self.interrupted_at: float | None = None
        self._began: dict[int, float] = {}
        #: Bumped by every change worth a write: a save that finds it moved
        #: while it wrote writes again (see save).
        self._version = 0

    def step_done(self, step: int) -> None:
        """Cheap (no I/O) except the first time: that one marks training again.
        No lock after the first: it runs every step, and a SIGTERM handler
        landing in it must find no lock held (a preemption callback waiting
        on a save another thread completes would wait forever); a step
        number a concurrent save overtakes is put right at the next step."""
        if self.first_step is None:
            with self._lock:
                self.first_step, self._first_mono = step, self.monotonic()
                if self.training_at is None:
                    self.training_at = self.clock()
                self.step, self._last_mono = step, self._first_mono
                self._version += 1
            self.save()
            return
        self.step = step if self.step is None else max(self.step, step)
        self._last_mono = self.monotonic()

    def training(self) -> None:
        """Training again, for trainers that never call step_done: the first
        time their loop asks for a checkpoint request (or begins a save)."""
        if self.training_at is not None:
            return
        with self._lock:
            self.training_at = self.clock()
            self._version += 1
        self.save()

    def began(self, step: int) -> None:
        with self._lock:
            self._began[step] = self.monotonic()

    def unblocked(self, step: int) -> None:
        """An asynchronous save handed the rest to the background: the
        trainer's blocked time for `step` ends here, not at complete()."""
        with self._lock:
            began = self._began.pop(step, None)
            if began is not None:
                self.blocked_s += max(0.0, self.monotonic() - began)

    def completed_step(self, step: int) -> None:
        with self._lock:
            began = self._began.pop(step, None)
            if began is not None:
                self.blocked_s += max(0.0, self.monotonic() - began)
            self.saves += 1
            self.completed[step] = self.clock()
            for old in sorted(self.completed)[:-MAX_COMPLETED]:
                self.completed.pop(old, None)  # a handler's save may have pruned it
            self.step = step if self.step is None else max(self.step, step)
            self._version += 1
        self.save()

    def interrupted(self) -> None:
        with self._lock:
            if self.interrupted_at is None:
                self.interrupted_at = self.clock()
            self._version += 1
        self.save()

    def step_seconds(self) -> float | None:
        if None in (self._first_mono, self._last_mono, self.first_step, self.step) \
                or self.step == self.first_step:
            return None
        return (self._last_mono - self._first_mono) / (self.step - self.first_step)  # type: ignore[operator]

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            seconds = self.step_seconds()
            return {"pid": os.getpid(), "startedAt": self.started_at,
                    "trainingAt": self.training_at, "firstStep": self.first_step,
                    "step": self.step, "stepSeconds": None if seconds is None
                    else round(seconds, 6),
                    "blockedSeconds": round(self.blocked_s, 6), "saves": self.saves,
                    "completed": {str(s): t for s, t in sorted(self.completed.items())},
                    "interruptedAt": self.interrupted_at}

    def save(self) -> None:
        """Best effort: progress is never worth failing a trainer for.

        A SIGTERM handler may write the file in the middle of this write (it
        runs in the same thread, between bytecodes); the interrupted write
        then replaces the handler's newer one, so it writes again when a
        change came meanwhile: the last write is always the newest state."""
        if self._write is None:
            return
        for _ in range(4):  # a change per write is all a handler can add
            with self._lock:
                version, doc = self._version, self.to_dict()
            with contextlib.suppress(OSError):
                self._write(self.path, doc)
            if self._version == version:
                return
