"""The agent's drain worker: local steps to the global tier, newest first.

One thread, one checkpoint in flight (more would only split the share). The
engine (`transfer.drain.Drainer`) streams, rate-limits, journals and
verifies; this worker decides *which* step to send and what to do when
things go wrong:

- newest first: a newer step arriving while an older one drains supersedes
  it unless the older one is nearly done (`supersede_decision`); a superseded step's
  journal stays, so nothing already sent is wasted if it is resumed;
- failures are retried with capped exponential backoff (the trainer never
  waits on this) and reported: a store that did not answer as Retrying (it
  will likely heal by itself), anything a person must fix (denied
  credentials, a missing bucket, a corrupt local copy, a conflicting commit)
  as Failed;
- a step already complete in the store with the same content (a previous
  agent finished it, or restore fetched it from there) is marked global
  without re-sending; one committed with other content, or unreadable, is a
  CommitConflict: reported and retried, the step stays local (never marked
  global, so retention keeps it; the drain never overwrites it);
- a drain that makes no progress for `stall_after` seconds is cancelled and
  retried as a failure (transfer/stall.py), and said so at once;
- `housekeeping` (the writer's orphaned uploads, transfer/orphans.py) runs
  when the worker starts and after each failure;
- the requests each checkpoint cost (all its attempts) go to the metrics and,
  with Global, to the checkpoint's record.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from ckptdrain.agent.metrics import AgentMetrics
from ckptdrain.agent.report import CheckpointEvent, Reporter, State
from ckptdrain.errors import CkptdrainError, StoreAccessDenied, StoreError, StoreUnreachable
from ckptdrain.node.localtier import LocalTier
from ckptdrain.request_counts import RequestCounts
from ckptdrain.store.base import Store
from ckptdrain.transfer import journal as jr
from ckptdrain.transfer.commit import committed
from ckptdrain.transfer.drain import Drainer, supersede_decision
from ckptdrain.transfer.drain_run import DrainCancelled
from ckptdrain.transfer.stall import DEFAULT_STALL_AFTER, StallGuard

log = logging.getLogger(__name__)

BACKOFF_START = 1.0
BACKOFF_MAX = 60.0


class Fence(Protocol):
    """The writer's fence (node.kube.WriterLease): `check` raises when another
    pod holds this writer; `release` frees it once nothing more is committed."""

    def check(self) -> None: ...

    def release(self) -> None: ...


def is_transient(err: BaseException) -> bool:
    """A drain failure that retrying is likely to cure by itself: the store did
    not answer, or answered with an error that is not about credentials,
    the bucket or the bytes."""
    if isinstance(err, StoreUnreachable):
        return True
    return type(err) is StoreError and not isinstance(err, StoreAccessDenied)


def next_backoff(previous: float | None) -> float:
    return BACKOFF_START if previous is None else min(BACKOFF_MAX, previous * 2)


class DrainWorker:
    def __init__(
        self,
        tier: LocalTier,
        store: Store,
        drainer: Drainer,
        reporter: Reporter,
        metrics: AgentMetrics,
        *,
        part_size: int,
        on_global: Callable[[int], None] | None = None,
        fence: Fence | None = None,
        stall_after: float = DEFAULT_STALL_AFTER,
        housekeeping: Callable[[], object] | None = None,
    ) -> None:
        self.tier = tier
        self.store = store
        self.drainer = drainer
        self.reporter = reporter
        self.metrics = metrics
        self.part_size = part_size
        self.on_global = on_global
        self.fence = fence
        self.stall_after = stall_after
        self.housekeeping = housekeeping
        #: Requests spent per step so far (every attempt), until it is global.
        self._spent: dict[int, RequestCounts] = {}
        self._attempt_start: RequestCounts | None = None
        self._guard: StallGuard | None = None
        #: A step made global by this attempt, whose retention (`on_global`)
        #: runs once the stall guard is off: it sends no data.
        self._retention_due: int | None = None
        self._cond = threading.Condition()
        self._pending: dict[int, str] = {}  # step -> trigger
        self._current: int | None = None
        self._cancel: threading.Event | None = None
        #: In flight when abandon_above() cancelled it: not queued again when
        #: it stops, though its local copy is still there (the loop removes it
        #: after); a later submit() is a new capture and drains as any step.
        self._abandoned: int | None = None
        self._sent = 0
        self._total = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="drain", daemon=True)
        self.last_result: object = None
        #: The last failure while it is not yet cured, said as reported.
        self.last_error: str | None = None

    # -- control (any thread) ------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, step: int, trigger: str = "schedule") -> None:
        with self._cond:
            self._pending[step] = trigger
            if step == self._abandoned:
                self._abandoned = None
            current = self._current
            if (current is not None and step > current and self._cancel is not None
                    and supersede_decision(self._sent, self._total, True) == "supersede"):
                log.info("step %d supersedes step %d (%d of %d bytes sent)",
                         step, current, self._sent, self._total)
                self._cancel.set()
            self._cond.notify_all()

    def cancel_current(self) -> None:
        """Stop the in-flight drain at its next part boundary (it stays pending)."""
        with self._cond:
            if self._cancel is not None:
                self._cancel.set()

    def abandon_above(self, step: int) -> None:
        """Forget steps newer than `step` (an abandoned timeline): queued ones
        go, an in-flight one stops at its next part boundary, or at the latest
        right before its manifest is written: nothing of it is committed after
        this returns but a write already under way (its local copy is removed
        next, so it is not queued again)."""
        with self._cond:
            for newer in [s for s in self._pending if s > step]:
                del self._pending[newer]
            if self._current is not None and self._current > step and self._cancel is not None:
                self._cancel.set()
                self._abandoned = self._current

    def stop(self, timeout: float) -> bool:
        """Cancel, journal and stop; True if the worker thread ended within `timeout`."""
        self._stopping.set()
        self.cancel_current()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout)
        ended = not self._thread.is_alive()
        if ended and self.fence is not None:
            self.fence.release()  # nothing more will be committed by this pod
        return ended

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def should_yield(self) -> bool:
        """Work that can wait (cold storage) ends now: the worker is stopping,
        or a step waits to be drained (a SIGTERM flush submits its step
        before it stops the worker)."""
        with self._cond:
            return self._stopping.is_set() or bool(self._pending)

    def busy_steps(self) -> set[int]:
        """Steps queued or in flight: retention must not delete these."""
        with self._cond:
            busy = set(self._pending)
            if self._current is not None:
                busy.add(self._current)
            return busy

    def lag_bytes(self) -> int:
        with self._cond:
            steps = set(self._pending) | ({self._current} if self._current is not None else set())
            sent = self._sent if self._current is not None else 0
        return max(0, sum(self.tier.bytes_of(s) for s in steps) - sent)

    def is_done(self, step: int) -> bool:
        return self.tier.has(step) and self.tier.is_global(step)

    # -- the worker thread -------------------------------------------------------------
    def _take(self) -> tuple[int, str] | None:
        with self._cond:
            while not self._pending and not self._stopping.is_set():
                self._cond.wait()
            if self._stopping.is_set():
                return None
            step = max(self._pending)
            trigger = self._pending.pop(step)
            self._current, self._cancel = step, threading.Event()
            self._sent, self._total = 0, self.tier.bytes_of(step)
            return step, trigger

    def _housekeep(self) -> None:
        # Not while stopping: a SIGTERM flush spends its deadline on data.
        if self.housekeeping is None or self._stopping.is_set():
            return
        try:
            self.housekeeping()
        except (CkptdrainError, OSError) as err:  # cleanup never stops a drain
            log.warning("housekeeping of the store failed (tried again later): %s", err)

    def _run(self) -> None:
        backoff: float | None = None
        self._housekeep()
        while True:
            taken = self._take()
            if taken is None:
                return
            step, trigger = taken
            ok = False
            try:
                ok = self._drain_one(step, trigger)
                backoff, self.last_error = None, None
            except Exception as err:
                self.metrics.drain_failed(err)
                backoff = next_backoff(backoff)
                log.warning("drain of step %d failed (retry in %.0fs): %s", step, backoff, err)
                state = State.RETRYING if is_transient(err) else State.FAILED
                self.last_error = f"{err}"
                self.reporter.report(CheckpointEvent(
                    step, state, message=f"drain: {err}; retrying in {backoff:.0f}s",
                    trigger=trigger))
                self._housekeep()
            finally:
                with self._cond:
                    abandoned = self._abandoned == step
                    self._current, self._cancel, self._abandoned = None, None, None
                    if ok:
                        # A newer global step makes older queued ones pointless.
                        for older in [s for s in self._pending if s < step]:
                            del self._pending[older]
                    elif not abandoned and self.tier.has(step) and \
                            not any(s > step for s in self._pending):
                        self._pending.setdefault(step, trigger)
            if backoff is not None:
                self._stopping.wait(backoff)

    def _drain_one(self, step: int, trigger: str) -> bool:
        """Drain `step` under the stall guard, counting the requests it costs;
        True when it is global, False when cancelled or superseded. A stalled
        attempt raises DrainStalled, whatever it was doing when cancelled."""
        assert self._cancel is not None
        gate = getattr(self.store, "gate", None)
        self._attempt_start = before = gate.counts if gate is not None else None
        self._guard = guard = StallGuard(
            self.stall_after, self._progress_mark, self._cancel,
            lambda message: self._stalled(step, trigger, message), what=f"drain of step {step}")
        ok = False
        self._retention_due = None
        try:
            with guard:
                ok = self._drain_watched(step, trigger)
            # After the guard: retention lists and deletes, moving no byte, and
            # taking longer than the stall bound is no stall of a step already global.
            due, self._retention_due = self._retention_due, None
            if due is not None and self.on_global is not None and not self._stopping.is_set():
                self.on_global(due)
            return ok
        except Exception as err:
            if guard.stalled:
                raise guard.error() from err
            raise
        finally:
            if gate is not None and before is not None:
                spent = gate.counts.minus(before)
                self.metrics.store.add_requests(spent)
                if not ok and self.tier.has(step):  # the next attempt adds to it
                    self._spent[step] = self._spent.get(step, RequestCounts()).added(spent)

    def _stall_cancelled(self) -> bool:
        return self._guard is not None and self._guard.stalled

    def _requests_of(self, step: int) -> RequestCounts | None:
        """What `step` cost the store: its earlier attempts and this one so far."""
        gate = getattr(self.store, "gate", None)
        if gate is None or self._attempt_start is None:
            return None
        return self._spent.pop(step, RequestCounts()).added(
            gate.counts.minus(self._attempt_start))

    def _drain_watched(self, step: int, trigger: str) -> bool:
        if not self.tier.has(step):
            return False  # retention or an operator removed it; nothing to send
        if self.tier.is_global(step):
            return True
        manifest = self.tier.manifest(step)
        # Parsed and compared, not merely present: a corrupt manifest or another
        # pod's content under this step and writer raises CommitConflict here.
        if committed(self.store, manifest, replace=False) is not None:
            self._mark_global(step, manifest.total_bytes, 0.0, trigger, "already in the store")
            return True
        # A file captured by hard link that the trainer rewrote since: refused
        # before its bytes are sent (the drain's CRCs would refuse it after).
        self.tier.check_links(step)
        self.reporter.report(CheckpointEvent(step, State.DRAINING, manifest.total_bytes,
                                             trigger=trigger))
        started = time.monotonic()
        assert self._cancel is not None
        journal = jr.load(self.tier.journal_path(step))
        with self._cond:
            # Progress reports durable bytes, resumed ones included: start from those
            # so the drained-bytes counter only counts what this process sends.
            self._sent = journal.done_bytes if journal is not None else 0
        try:
            result = self.drainer.drain(
                self.tier.data_dir(step),
                manifest,
                journal_path=self.tier.journal_path(step),
                cancel=self._cancel,
                progress=self._progress,
                before_commit=self.fence.check if self.fence is not None else None,
            )
        except DrainCancelled:
            if self._stall_cancelled():
                raise  # _drain_one says it stalled
            log.info("drain of step %d paused after %d of %d bytes; its journal keeps the rest",
                     step, self._sent, self._total)
            # Back to Local: left at Draining, a superseded or paused step would
            # look like a drain still moving, which hides a stall.
            self.reporter.report(CheckpointEvent(
                step, State.LOCAL, manifest.total_bytes,
                message=f"drain paused after {self._sent} of {self._total} bytes"
                " (superseded by a newer step, or stopping); its journal keeps what was sent",
                trigger=trigger))
            return False
        self.last_result = result
        seconds = time.monotonic() - started
        self.metrics.drain_seconds.observe(seconds)
        # Say what was resumed: a journaled drain must not re-send finished parts.
        note = f"sent {result.sent_bytes} bytes, resumed {result.resumed_bytes} bytes"
        self._mark_global(step, manifest.total_bytes, seconds, trigger, note)
        return True

    def _progress_mark(self) -> int:
        """Grows while the drain moves: bytes handed to the socket, or made durable."""
        with self._cond:
            return self.drainer.limiter.granted + self._sent

    def _stalled(self, step: int, trigger: str, message: str) -> None:
        """Said the moment the stall bound passes, not when the attempt has unwound."""
        log.warning("%s", message)
        self.metrics.store.stalls.inc()
        self.reporter.report(CheckpointEvent(step, State.RETRYING, message=message,
                                             trigger=trigger))

    def _progress(self, sent: int, *_: object) -> None:
        """Bytes of this checkpoint sent so far (the engine's progress callback)."""
        with self._cond:
            delta = max(0, sent - self._sent)
            self._sent = sent
        self.metrics.drained_bytes.inc(delta)

    def _mark_global(self, step: int, size: int, seconds: float, trigger: str, note: str) -> None:
        self.tier.mark_global(step, self.store.uri)
        self.tier.journal_path(step).unlink(missing_ok=True)
        manifest = self.tier.manifest(step)
        self.metrics.recovery_point("global", step, manifest.created)
        spent = self._requests_of(step)
        self.reporter.report(CheckpointEvent(step, State.GLOBAL, size, seconds, note,
                                             trigger=trigger,
                                             requests=spent.as_record() if spent else None))
        # Retention (`on_global`) follows in _drain_one, outside the stall guard;
        # not while stopping: a SIGTERM flush spends its deadline on data, not cleanup.
        self._retention_due = step
