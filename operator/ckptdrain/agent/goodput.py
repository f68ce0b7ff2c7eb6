"""The agent's part of goodput accounting (docs/goodput.md).

The trainer's client keeps `<work>/.ckptdrain/progress` (progress.py). The
agent turns it into:

- metrics, continuously: seconds the trainer was blocked saving (in total,
  and per save as a histogram), its newest step, and the drain overlap
  (drain time ÷ global interval) of the newest drained checkpoint beside
  its target: the seeds' two rules (blocking per save at most 5% of the
  interval; overlap at most the target), which docs/alerts.md alerts on;
- the pod annotation `ckptdrain.io/goodput` (contract/goodput.py), written when
  training starts (once per pod) and after the SIGTERM capture (once per
  interruption), and refreshed for free on the pending-bytes patch the agent
  sends anyway. No write per checkpoint is added.

Annotating is best effort and off the agent's loop (a thread): the API server
being slow must never delay a capture or the SIGTERM flush.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram

from ckptdrain.agent.report import CheckpointEvent, State
from ckptdrain.client import CONTROL_DIR
from ckptdrain.contract.api import ANNOTATION_GOODPUT
from ckptdrain.contract.goodput import AgentView, from_progress
from ckptdrain.node.localtier import LocalTier
from ckptdrain.progress import PROGRESS_FILE

log = logging.getLogger(__name__)

#: How often the loop reads the progress file (a small local read).
READ_PERIOD_S = 2.0
#: Blocking per save: from a few milliseconds (asynchronous saves) to the
#: minutes a synchronous save of a large shard to a slow disk takes.
BLOCKING_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


def read_progress(work_dir: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((work_dir / CONTROL_DIR / PROGRESS_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


class GoodputMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.blocked = Gauge(
            "ckptdrain_trainer_blocked_seconds",
            "Seconds the trainer process spent inside checkpoint saves since it started",
            registry=registry)
        self.step = Gauge("ckptdrain_trainer_step", "Newest step the trainer reported",
                          registry=registry)
        self.per_save = Histogram(
            "ckptdrain_save_blocking_seconds",
            "Seconds the trainer was blocked by each save (begin() until complete(), or "
            "until an asynchronous save let it go)", buckets=BLOCKING_BUCKETS,
            registry=registry)
        self.overlap = Gauge(
            "ckptdrain_drain_overlap_ratio",
            "Drain time of the newest drained checkpoint divided by the global interval "
            "(the sizing model's overlap, measured)", registry=registry)
        self.overlap_target = Gauge(
            "ckptdrain_drain_overlap_target_ratio",
            "The overlap the policy asks for (spec.overlap): the measured overlap's target",
            registry=registry)


@dataclasses.dataclass(frozen=True)
class Drained:
    step: int
    seconds: float
    overlap: float


class OverlapReporter:
    """A report.Reporter: each drained checkpoint sets the measured overlap
    (its target is set once: the policy's, as this pod runs it)."""

    def __init__(self, metrics: GoodputMetrics, global_interval_s: float,
                 target: float | None = None) -> None:
        self.metrics, self.global_interval_s = metrics, global_interval_s
        #: The newest drained checkpoint, for the goodput annotation.
        self.newest: Drained | None = None
        if target is not None:
            metrics.overlap_target.set(target)

    def report(self, event: CheckpointEvent) -> None:
        if event.state is not State.GLOBAL or not event.seconds or self.global_interval_s <= 0:
            return
        if self.newest is None or event.step >= self.newest.step:
            overlap = event.seconds / self.global_interval_s
            self.newest = Drained(event.step, event.seconds, overlap)
            self.metrics.overlap.set(overlap)


class SaveCounter:
    """Each save's blocking time into the histogram, from the progress file's
    running totals (`blockedSeconds`, `saves`), read every few seconds: the
    blocked time added since the last read, spread evenly over the saves
    completed since (a trainer saving faster than the agent reads is rare,
    and the mean per save is exact either way). Blocked time with no save
    completed yet (an asynchronous save let go, still writing) waits for it.
    A new trainer process (another pid) starts from zero."""

    def __init__(self, histogram: Histogram) -> None:
        self.histogram = histogram
        self._pid: Any = object()
        self._blocked, self._saves = 0.0, 0

    def update(self, progress: dict[str, Any]) -> None:
        blocked, saves = progress.get("blockedSeconds"), progress.get("saves")
        if not isinstance(blocked, int | float) or isinstance(saves, bool) \
                or not isinstance(saves, int):
            return
        if progress.get("pid") != self._pid or saves < self._saves or blocked < self._blocked:
            self._pid, self._blocked, self._saves = progress.get("pid"), 0.0, 0
        if saves == self._saves:
            return
        each = max(0.0, blocked - self._blocked) / (saves - self._saves)
        for _ in range(saves - self._saves):
            self.histogram.observe(each)
        self._blocked, self._saves = blocked, saves


class GoodputWatcher:
    """Reads the trainer's progress from the agent's loop and publishes it."""

    def __init__(self, work_dir: Path, tier: LocalTier, metrics: GoodputMetrics,
                 annotate: Callable[[str, str], bool] | None,
                 clock: Callable[[], float] = time.monotonic, *,
                 drains: OverlapReporter | None = None, interval_s: float | None = None,
                 overlap_target: float | None = None) -> None:
        self.work_dir, self.tier, self.metrics = work_dir, tier, metrics
        self.annotate, self.clock = annotate, clock
        #: What the view says of the two rules: the newest drain (and the
        #: schedule it is measured against).
        self.drains, self.interval_s, self.overlap_target = drains, interval_s, overlap_target
        self._saves = SaveCounter(metrics.per_save)
        self.progress: dict[str, Any] | None = None
        self._next_read = 0.0
        self._published_training: float | None = None
        #: Once set, in every view this agent sends: the pending-bytes patch
        #: after the SIGTERM flush must not erase the interruption it follows.
        self.interrupted_at: float | None = None
        self._threads: list[threading.Thread] = []
        #: One sender at a time, and it sends the newest view: two patches in
        #: flight could land in either order, an older view last.
        self._send_lock = threading.Lock()
        self._unsent: AgentView | None = None
        self._sending = False

    def view(self, interrupted_at: float | None = None) -> AgentView:
        """The annotation's content now (with the interruption, once there is one)."""
        interrupted_at = interrupted_at if interrupted_at is not None else self.interrupted_at
        progress = dict(self.progress or {})
        steps = self.tier.steps()
        local = steps[0] if steps else None
        glob = max((s for s in steps if self.tier.is_global(s)), default=None)
        if interrupted_at is not None:
            progress["interruptedAt"] = progress.get("interruptedAt") or interrupted_at
            if progress.get("step") is None:
                progress["step"] = local  # a trainer without the client: its newest save
        else:
            progress["interruptedAt"] = None
        view = from_progress(progress, newest_local=local, newest_global=glob)
        drained = self.drains.newest if self.drains is not None else None
        return dataclasses.replace(
            view, interval_s=self.interval_s, overlap_target=self.overlap_target,
            drained_step=None if drained is None else drained.step,
            drain_s=None if drained is None else drained.seconds,
            drain_overlap=None if drained is None else drained.overlap)

    def annotation(self) -> dict[str, str]:
        """For the pending-bytes patch: the newest view, blocked seconds included."""
        return {} if self.progress is None else {ANNOTATION_GOODPUT: self.view().to_json()}

    def tick(self) -> None:
        now = self.clock()
        if now < self._next_read:
            return
        self._next_read = now + READ_PERIOD_S
        self.refresh()
        training = (self.progress or {}).get("trainingAt")
        if isinstance(training, int | float) and training != self._published_training:
            self._published_training = training
            self._publish(self.view())

    def refresh(self) -> None:
        progress = read_progress(self.work_dir)
        if progress is None:
            return
        self.progress = progress
        blocked, step = progress.get("blockedSeconds"), progress.get("step")
        if isinstance(blocked, int | float):
            self.metrics.blocked.set(blocked)
        if isinstance(step, int):
            self.metrics.step.set(step)
        self._saves.update(progress)

    def interrupted(self, at: float) -> None:
        """After the SIGTERM capture: the interruption, with the trainer's newest
        step (its emergency save included) and what each tier holds."""
        self.refresh()
        self.interrupted_at = at
        view = self.view()
        def up_to(step: int | None) -> str:
            return "nothing" if step is None else str(step)

        at_step = ("an unknown step (the trainer reported none)" if view.step is None
                   else f"step {view.step}")
        log.info("interrupted at %s (local tier up to %s, global up to %s)",
                 at_step, up_to(view.newest_local), up_to(view.newest_global))
        self._publish(view)

    def _publish(self, view: AgentView) -> None:
        if self.annotate is None:
            return
        with self._send_lock:
            self._unsent = view
            if self._sending:
                return  # the sender in flight sends it next
            self._sending = True
        thread = threading.Thread(target=self._send_newest, name="goodput", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _send_newest(self) -> None:
        assert self.annotate is not None
        while True:
            with self._send_lock:
                view, self._unsent = self._unsent, None
                if view is None:
                    self._sending = False
                    return
            try:
                self.annotate(ANNOTATION_GOODPUT, view.to_json())
            except Exception:  # the next view is still sent
                log.exception("goodput: could not annotate the pod")

    def close(self, timeout: float) -> None:
        """Give the last annotation a moment to land (it is the interruption's)."""
        end = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))
