"""The agent's part of goodput accounting (docs/goodput.md).

The trainer's client keeps `<work>/.ckptdrain/progress` (progress.py). The
agent turns it into:

- metrics, continuously: seconds the trainer was blocked saving, its newest
  step, and the drain overlap (drain time ÷ global interval) of the newest
  drained checkpoint;
- the pod annotation `ckptdrain.io/goodput` (contract/goodput.py), written when
  training starts (once per pod) and after the SIGTERM capture (once per
  interruption), and refreshed for free on the pending-bytes patch the agent
  sends anyway. No write per checkpoint is added.

Annotating is best effort and off the agent's loop (a thread): the API server
being slow must never delay a capture or the SIGTERM flush.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from ckptdrain.agent.report import CheckpointEvent, State
from ckptdrain.client import CONTROL_DIR
from ckptdrain.contract.api import ANNOTATION_GOODPUT
from ckptdrain.contract.goodput import AgentView, from_progress
from ckptdrain.node.localtier import LocalTier
from ckptdrain.progress import PROGRESS_FILE

log = logging.getLogger(__name__)

#: How often the loop reads the progress file (a small local read).
READ_PERIOD_S = 2.0


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
        self.overlap = Gauge(
            "ckptdrain_drain_overlap_ratio",
            "Drain time of the newest drained checkpoint divided by the global interval "
            "(the sizing model's overlap, measured)", registry=registry)


class OverlapReporter:
    """A report.Reporter: each drained checkpoint sets the measured overlap."""

    def __init__(self, metrics: GoodputMetrics, global_interval_s: float) -> None:
        self.metrics, self.global_interval_s = metrics, global_interval_s

    def report(self, event: CheckpointEvent) -> None:
        if event.state is State.GLOBAL and event.seconds and self.global_interval_s > 0:
            self.metrics.overlap.set(event.seconds / self.global_interval_s)


class GoodputWatcher:
    """Reads the trainer's progress from the agent's loop and publishes it."""

    def __init__(self, work_dir: Path, tier: LocalTier, metrics: GoodputMetrics,
                 annotate: Callable[[str, str], bool] | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.work_dir, self.tier, self.metrics = work_dir, tier, metrics
        self.annotate, self.clock = annotate, clock
        self.progress: dict[str, Any] | None = None
        self._next_read = 0.0
        self._published_training: float | None = None
        #: Once set, in every view this agent sends: the pending-bytes patch
        #: after the SIGTERM flush must not erase the interruption it follows.
        self.interrupted_at: float | None = None
        self._threads: list[threading.Thread] = []

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
        return from_progress(progress, newest_local=local, newest_global=glob)

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
        annotate = self.annotate
        thread = threading.Thread(target=lambda: annotate(ANNOTATION_GOODPUT, view.to_json()),
                                  name="goodput", daemon=True)
        thread.start()
        self._threads.append(thread)

    def close(self, timeout: float) -> None:
        """Give the last annotation a moment to land (it is the interruption's)."""
        end = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))
