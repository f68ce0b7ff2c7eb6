"""The agent's start-up, before its schedule loop runs (agent/loop.py): tidy
what a previous process left on the local tier (unfinished captures,
unreadable steps moved aside), follow a restore that ran for this pod (local
steps of the abandoned timeline dropped, the restored one kept in the work
dir), and resume the drains that were not finished.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import TYPE_CHECKING

from ckptdrain.agent.report import CheckpointEvent, Reporter, State
from ckptdrain.errors import IntegrityError
from ckptdrain.jsonfile import read_object
from ckptdrain.manifest import EXTRA_TIMELINE, WriterManifest
from ckptdrain.node.steps import step_name

if TYPE_CHECKING:
    from ckptdrain.agent.drainworker import DrainWorker
    from ckptdrain.agent.metrics import AgentMetrics
    from ckptdrain.node.config import AgentConfig
    from ckptdrain.node.localtier import LocalTier

log = logging.getLogger(__name__)


class AgentStartup:
    """Agent's start-up (`recover`), run once before its first tick."""

    cfg: AgentConfig
    tier: LocalTier
    reporter: Reporter
    metrics: AgentMetrics
    drain: DrainWorker | None
    keep_in_work: set[int]
    #: The timeline the trainer continues (restore.json's, restore/agreement.py):
    #: every capture is tagged with it. None: restore did not coordinate.
    timeline: str | None
    #: The step the trainer resumed from (restore's, or the ranks' after a
    #: restart in place); None for a fresh start.
    resumed: int | None

    def recover(self) -> None:
        """Tidy what a previous process left and resume its unfinished drains."""
        for temp in self.tier.remove_temps():
            log.info("removed an unfinished capture: %s", temp)
        self._follow_restore()
        for step in self.tier.steps():
            self._manifest_or_quarantine(step)
        steps = self.tier.steps()
        for step in steps:
            manifest = self.tier.manifest(step)
            self.metrics.recovery_point("local", step, manifest.created)
            if self.tier.is_global(step):
                self.metrics.recovery_point("global", step, manifest.created)
        if self.drain is None:
            return
        newest_global = max((s for s in steps if self.tier.is_global(s)), default=-1)
        resume = [s for s in self.tier.unfinished_drains() if s > newest_global]
        if steps and steps[0] > newest_global:
            resume.append(steps[0])  # the newest local step is the recovery point: protect it
        for step in sorted(set(resume)):
            log.info("resuming the drain of step %d", step)
            self.drain.submit(step, "resume")

    def _follow_restore(self) -> None:
        """If restore ran for this pod, the trainer resumes from the restored step
        (or from scratch): local steps newer than that belong to an abandoned
        timeline (with several writers, restore may pick an older globally
        complete step). They would shadow the new steps, so drop them; and the
        restored step itself stays in the work dir while the trainer loads it."""
        doc = read_object(self.cfg.restore_result)
        if doc is None:
            return
        self.metrics.restored(doc)
        timeline = doc.get("timeline")
        self.timeline = timeline if isinstance(timeline, str) and timeline else None
        restored = doc.get("step")
        restored = restored if isinstance(restored, int) else -1
        self.resumed = restored if restored >= 0 else None
        restored_at = doc.get("at")
        if not isinstance(restored_at, int | float):
            return
        if restored >= 0:
            self.keep_in_work.add(restored)
        for step in self.tier.steps():
            # Steps captured after the restore are this run's (a restarted agent
            # must keep them); only older ones belong to the abandoned timeline.
            if step <= restored:
                continue
            manifest = self._manifest_or_quarantine(step)
            # By the timeline when restore named one: an old pod of this rank
            # on this node may capture its SIGTERM step after the restore.
            other_run = self.timeline is not None and manifest is not None and \
                manifest.extra.get(EXTRA_TIMELINE) != self.timeline
            if manifest is not None and (manifest.created < restored_at or other_run):
                log.warning("dropping local step %d: the trainer resumed from %s", step,
                            restored if restored >= 0 else "scratch")
                self.tier.remove(step)

    def _manifest_or_quarantine(self, step: int) -> WriterManifest | None:
        """The step's manifest; None when it is unreadable, and then the step
        is moved aside as `.corrupt-step-<N>` (a name the tier never lists) and
        reported. Moved, not deleted: its data may be the only copy and an
        operator can still inspect or repair it; out of the tier's way it no
        longer stops every start of the agent."""
        try:
            return self.tier.manifest(step)
        except IntegrityError as err:
            aside = self.tier.root / f".corrupt-{step_name(step)}"
            shutil.rmtree(aside, ignore_errors=True)  # an earlier quarantine of this step
            os.rename(self.tier.step_dir(step), aside)
            log.error("local step %d is unreadable (%s): moved aside to %s; it is not "
                      "drained or restored, delete it once inspected", step, err, aside)
            self.reporter.report(CheckpointEvent(
                step, State.FAILED, message=f"local copy unreadable ({err}); moved aside to "
                f"{aside.name}, not drained"))
            return None


