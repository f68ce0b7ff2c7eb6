"""The agent's schedule loop (its start-up: agent/startup.py; its SIGTERM flush: agent/flush.py).

Steady state, every `POLL` seconds:
- every `interval`, ask the trainer for a checkpoint (rewrite the request file);
- capture the newest step the trainer has published, if it is new. The local
  tier stays within the policy's capacity and the disk's free space, and a
  scheduled capture always leaves room for one more step of its size, so the
  SIGTERM checkpoint finds it (two when the trainer's work dir is on the tier's
  disk, its next save landing there too, and the capacity holds keep + 3 steps:
  node/space.py): older steps go first (global ones before local ones; never
  one being drained or the only copy of the recovery point). A capture that
  cannot fit even then is refused before anything is written; a failed capture
  is retried with exponential back-off (1 s doubling to 60 s) and reported once
  per distinct failure, not once per retry;
- hand the first capture, and with `global_every` > 1 the first step saved in
  each period of interval × global_every, to the drain worker (every writer
  picks the same steps: agent/global_choice.py);
- apply local retention and prune superseded steps from the work dir; with
  the work dir on the node and the writer's lease held, remove the work dirs
  earlier pods of this writer left there (agent/stale_work.py).

On SIGTERM the loop ends and the flush runs (agent/flush.py).

Nothing here ever blocks or signals the trainer: it only reads the work dir.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ckptdrain.agent import control
from ckptdrain.agent import flush as flush_mod
from ckptdrain.agent.drainworker import DrainWorker, next_backoff
from ckptdrain.agent.global_choice import GlobalChoice, saved_at
from ckptdrain.agent.metrics import AgentMetrics
from ckptdrain.agent.report import CheckpointEvent, Reporter, State
from ckptdrain.agent.stale_work import StaleWork, volume_root
from ckptdrain.agent.startup import AgentStartup
from ckptdrain.client import REQUEST_FILE, read_request
from ckptdrain.contract import tier_reserve
from ckptdrain.errors import CkptdrainError
from ckptdrain.manifest import EXTRA_TIMELINE
from ckptdrain.node import space
from ckptdrain.node.config import AgentConfig
from ckptdrain.node.durable import CopyAborted
from ckptdrain.node.localtier import LocalTier
from ckptdrain.node.steps import completed_steps, step_dir
from ckptdrain.restore import workdir

log = logging.getLogger(__name__)

POLL = 0.2


class Agent(AgentStartup):
    def __init__(
        self,
        cfg: AgentConfig,
        tier: LocalTier,
        reporter: Reporter,
        metrics: AgentMetrics,
        drain: DrainWorker | None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.tier = tier
        self.reporter = reporter
        self.metrics = metrics
        self.drain = drain
        self.clock = clock
        self.terminating = threading.Event()
        self.aborting = threading.Event()  # a second SIGTERM
        self.sigterm_at: float | None = None
        self.global_choice = GlobalChoice(cfg.interval_s, cfg.global_every)
        #: Work-dir steps the loop must not prune (the step a restore round
        #: placed for the trainer): changed, and read with the pruning that
        #: follows, only under `work_lock`.
        self.keep_in_work: set[int] = set()
        self.work_lock = threading.Lock()
        self.timeline: str | None = None
        self.resumed: int | None = None
        self._seq = (read_request(cfg.work_dir).seq if read_request(cfg.work_dir) else 0)
        self._next_request: float | None = None
        # Capture back-off: the step that failed, when to try it again, the
        # current delay, and the failure last reported (step, kind).
        self._failed_step: int | None = None
        self._retry_at = 0.0
        self._backoff: float | None = None
        self._reported: tuple[int | None, str] | None = None
        # A full local tier holds no newer step either: back off across steps.
        self._no_room = False
        # Steps whose failed prune was logged (once each; every try is counted).
        self._prune_reported: set[int] = set()
        self._apply_failed: str | None = None  # the last failure of apply_round(), said once
        root = volume_root(cfg.work_dir, cfg.local_dir)  # None: the work dir is not on the node
        #: Steps of a size kept free between scheduled captures (contract/tier_reserve.py).
        self.reserve_steps = functools.partial(
            tier_reserve.reserve_steps, capacity=cfg.local_capacity, keep=cfg.local_keep,
            work_on_disk=root is not None)
        self.stale_work = None if root is None else StaleWork(
            root, cfg.work_dir, failed=self.metrics.errors.labels("prune").inc)
        #: agent/goodput.GoodputWatcher, when the agent accounts for goodput.
        self.goodput: Any = None
        #: agent/refusals.RefusalEvents: an Event when the local tier refuses a capture.
        self.refusals: Any = None
        #: agent/rounds.Rounds: restore rounds while the pod runs (several writers).
        self.rounds: Any = None

    # -- signals -----------------------------------------------------------------
    def on_sigterm(self) -> None:
        """Called from the signal handler: the first asks for a flush, the second aborts."""
        if self.terminating.is_set():
            self.aborting.set()
            if self.drain is not None:
                self.drain.cancel_current()
            return
        self.sigterm_at = self.clock()
        self.terminating.set()

    def _past_deadline(self) -> bool:
        if self.aborting.is_set():
            return True
        return self.sigterm_at is not None and \
            self.clock() >= self.sigterm_at + self.cfg.flush_budget_s

    # -- steady state ---------------------------------------------------------------
    def run(self) -> int:
        """Run until SIGTERM, then flush. Returns the exit code (0)."""
        self.recover()
        while not self.terminating.is_set():
            self.tick()
            self.terminating.wait(POLL)
        return self.flush()

    def flush(self) -> int:
        """The SIGTERM flush (agent/flush.py); returns the exit code (0)."""
        return flush_mod.flush(self)

    def tick(self) -> None:
        """One pass of the steady state: request, capture (unless backing off), tidy."""
        self.metrics.beat()
        now = self.clock()
        self.apply_round()
        if self.goodput is not None:
            self.goodput.tick()
        if self._next_request is None:
            self._next_request = now + self.cfg.interval_s
        if now >= self._next_request:
            self.request("schedule")
            self._next_request = max(self._next_request + self.cfg.interval_s, now + POLL)
        published = completed_steps(self.cfg.work_dir)
        if published and now < self._retry_at and (
                self._no_room or published[0] == self._failed_step):
            # Backing off. A newer step is tried at once after a bad step, but not
            # after a full tier: it would not fit either, and each try is an event.
            return
        try:
            # A SIGTERM during this capture lets it finish (it is likely the newest
            # state) unless the flush deadline passes or a second SIGTERM comes.
            captured = self.capture_newest("schedule", should_stop=self._past_deadline)
        except CopyAborted:
            log.warning("capture stopped by the SIGTERM deadline")
            return
        except (CkptdrainError, OSError) as err:
            # A bad checkpoint or a full disk must not stop the schedule, nor
            # turn into a storm of copies and events.
            self.metrics.errors.labels("capture").inc()
            step = published[0] if published else None
            no_room = space.is_no_room(err)
            same = step == self._failed_step or (no_room and self._no_room)
            self._backoff = next_backoff(self._backoff if same else None)
            self._failed_step, self._retry_at, self._no_room = step, now + self._backoff, no_room
            log.warning("capture of step %s failed, retrying in %.0fs: %s", step,
                        self._backoff, err)
            return
        if captured is not None:
            self._failed_step, self._backoff, self._reported = None, None, None
            self._no_room = False
        self.housekeeping()

    def apply_round(self) -> None:
        """Apply a settled restore round (agent/rounds.py). A failure (the trainer's
        answer cannot be written on a full disk) stops neither the schedule nor the
        SIGTERM flush: it is counted, logged when it changes, and tried again next
        tick; the round stays settled until its answer is written."""
        if self.rounds is None:
            return
        try:
            self.rounds.apply()
        except (CkptdrainError, OSError) as err:
            self.metrics.errors.labels("resume").inc()
            if str(err) != self._apply_failed:
                log.warning("could not apply the restore round (tried again): %s", err)
            self._apply_failed = str(err)
        else:
            self._apply_failed = None

    def request(self, reason: str) -> None:
        """Ask the trainer for a checkpoint. It answers by publishing a step."""
        self._seq += 1
        try:
            control.write(self.cfg.work_dir, REQUEST_FILE,
                          {"seq": self._seq, "reason": reason, "at": time.time()})
        except OSError as err:
            self.metrics.errors.labels("request").inc()
            log.warning("could not write the checkpoint request: %s", err)

    def capture_newest(self, trigger: str, should_stop: Callable[[], bool] | None = None
                       ) -> int | None:
        """Capture the newest published step unless the tier already has it
        (or something newer). Returns the captured step or None."""
        published = completed_steps(self.cfg.work_dir)
        local = self.tier.steps()
        if not published or (local and published[0] <= local[0]):
            return None
        step = published[0]
        source = step_dir(self.cfg.work_dir, step)
        try:
            saved = saved_at(source)
        except FileNotFoundError:
            return None  # replaced (restore) or pruned since the listing: next poll
        if self._reported is None or self._reported[0] not in (step, None):  # not a retry
            self.reporter.report(CheckpointEvent(step, State.CAPTURING, trigger=trigger))
        try:
            if not self.tier.has(step):
                need = space.tree_bytes(source)
                # The emergency capture spends the reserve the scheduled ones kept.
                self.make_room(need, step=step, reserve=0 if trigger == "sigterm"
                               else need * self.reserve_steps(need))
            captured = self.tier.capture(source, step, writer=self.cfg.writer,
                                         writers=self.cfg.writers, should_stop=should_stop,
                                         extra=self._capture_extra(trigger))
        except CopyAborted:
            raise  # a deadline, not a failure: nothing was published
        except FileNotFoundError as err:
            # The trainer (or restore) replaced the step while we copied it.
            log.warning("step %d vanished while capturing (%s); will retry", step, err)
            return None
        except Exception as err:
            kind = f"{type(err).__name__}:{getattr(err, 'errno', '')}"
            # One event per distinct failure; a full tier is one failure whatever the step.
            key = (None if space.is_no_room(err) else step, kind)
            if self._reported != key:
                self._reported = key
                self.reporter.report(CheckpointEvent(step, State.FAILED,
                                                     message=f"capture: {err}", trigger=trigger))
                if self.refusals is not None and isinstance(err, space.WontFit):
                    self.refusals.refused(step, str(err))
            raise
        size = captured.manifest.total_bytes
        self.metrics.captured_bytes.inc(size)
        self.metrics.capture_seconds.observe(captured.seconds)
        for method, files in captured.methods.items():
            self.metrics.capture_files.labels(method).inc(files)
        self.metrics.recovery_point("local", step, captured.manifest.created)
        self.reporter.report(CheckpointEvent(step, State.LOCAL, size, captured.seconds,
                                             trigger=trigger))
        bound = self.rounds.abandoning() if self.rounds is not None else None
        if bound is not None and step > bound:
            # A round settled while this copy ran: the step is abandoned, never sent.
            log.warning("captured step %d is abandoned by a restore round: not drained", step)
        elif self.drain is not None:
            if trigger != "schedule":
                self.global_choice.sent(saved)
                self.drain.submit(step, trigger)
            elif self.global_choice.choose(saved):
                self.drain.submit(step, trigger)
        return step

    def _capture_extra(self, trigger: str) -> dict[str, str]:
        """What a capture's manifest records beside its files: why it was taken,
        and the timeline it belongs to (ranks agree only on copies of one)."""
        extra = {"trigger": trigger}
        if self.timeline:
            extra[EXTRA_TIMELINE] = self.timeline
        return extra

    def make_room(self, need: int, reserve: int, step: int | None = None) -> list[int]:
        """Remove what must go for `need` bytes plus `reserve` to fit the local
        tier (LocalTier.make_room); raises space.WontFit, removing nothing."""
        busy = self.drain.busy_steps() if self.drain is not None else set()
        return self.tier.make_room(need, reserve, capacity=self.cfg.local_capacity,
                                   protected=busy, step=step)

    def housekeeping(self) -> None:
        busy = self.drain.busy_steps() if self.drain is not None else set()
        try:
            removed = self.tier.apply_retention(self.cfg.local_keep, busy)
            # Retention by count alone can outgrow the capacity when steps grow:
            # keep the reserve free between captures (capture says what cannot go).
            if local := self.tier.steps():
                newest = self.tier.bytes_of(local[0])
                with contextlib.suppress(space.WontFit):
                    removed += self.make_room(0, reserve=newest * self.reserve_steps(newest))
        except OSError as err:
            self.metrics.errors.labels("retention").inc()
            log.warning("retention failed: %s", err)
            removed = []
        if removed:
            log.info("retention removed local steps %s", removed)
        self.prune_work_dir()
        self.prune_stale_work()
        if self.drain is not None:
            self.metrics.lag_bytes.set(self.drain.lag_bytes())

    def prune_stale_work(self) -> None:
        """Earlier pods' work dirs of this writer go once this pod holds the
        writer's lease: the old pod lost it, so it writes and drains no more.
        Without a lease (no drain, no fence) nothing tells, so nothing goes."""
        fence = self.drain.fence if self.drain is not None else None
        if self.stale_work is not None and getattr(fence, "held", False):
            self.stale_work.prune()

    def prune_work_dir(self) -> None:
        """Remove published work-dir steps older than the newest captured one: the work dir's
        disk is small, and the local tier holds something newer. What cannot be removed (a
        trainer's file the pod's group may not delete) is removed as far as it can be, counted
        in ckptdrain_errors_total{phase="prune"} and logged once per step with the path and the
        reason: left silently, it fills the work dir."""
        local = self.tier.steps()
        if not local:
            return
        for step in completed_steps(self.cfg.work_dir):
            if step >= local[0]:
                continue
            victim = step_dir(self.cfg.work_dir, step)
            doomed = workdir.aside(self.cfg.work_dir, step)
            # The check and the move as one: a round placing this step (the
            # rounds thread) finds it there and keeps it, or finds it gone.
            with self.work_lock:
                if step in self.keep_in_work:
                    continue
                try:
                    os.rename(victim, doomed)
                except OSError as err:
                    self._prune_failed(step, str(victim), err)
                    continue
            problems = workdir.remove_tree(doomed)  # out of sight now: no lock needed
            if problems:
                self._prune_failed(step, *problems[0])
        for leftover in self.cfg.work_dir.glob(f"{workdir.ASIDE_PREFIX}*"):
            workdir.remove_tree(leftover)  # what a failed prune left: as much as can go now

    def _prune_failed(self, step: int, path: str, err: OSError) -> None:
        """Counted and logged once per step (a step renamed aside is not listed
        again; one that could not be renamed would be, every tick)."""
        if step in self._prune_reported:
            return
        self._prune_reported.add(step)
        self.metrics.errors.labels("prune").inc()
        log.warning("cannot remove step %d from the work dir: %s: %s (errno %s); the "
                    "trainer's files must be removable by the pod's group", step, path,
                    err.strerror or err, err.errno)
