"""This rank's part in restore rounds while its pod runs (several writers).

Two duties (restore/agreement.py has the rules):

- *Report when another rank restores.* When a rank opens a round (a pod
  replaced, a trainer restarted in place), every running agent reports what
  its rank holds: the local tier's steps with their timelines, and the
  complete steps in the work dir (saved in this timeline). The restoring
  rank then agrees at once on the newest step every rank holds, instead of
  waiting out the bound for ranks that are not restarting.
- *Answer the trainer after a restart in place* (resume_channel.py): take
  part in a round as a restoring rank, put the agreed step in the work dir
  (it is there, or from the local tier, verified, or from the global tier;
  a step complete there comes from the node only as committed), and
  answer. Steps newer than the agreed one belong to an abandoned timeline:
  they leave the work dir and the local tier, and captures from then on
  carry the new timeline. Once the pod stops (SIGTERM), no round
  opens: the trainer is answered no at once.

Cost: one GET of the decision's Lease per poll (every max(2 s, W/100 s) for W
writers) and one write per round.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ckptdrain import group_access, keys, resume_channel
from ckptdrain.agent import control
from ckptdrain.client import CONTROL_DIR
from ckptdrain.errors import CkptdrainError, ObjectMissing, StoreError
from ckptdrain.manifest import EXTRA_TIMELINE, WriterManifest
from ckptdrain.node import durable
from ckptdrain.node.steps import completed_steps, step_dir
from ckptdrain.progress import PROGRESS_FILE
from ckptdrain.restore import meeting as meeting_mod
from ckptdrain.restore import workdir
from ckptdrain.restore.agreement import Decision, Report

if TYPE_CHECKING:
    from ckptdrain.agent.loop import Agent

log = logging.getLogger(__name__)


class Rounds:
    def __init__(self, agent: Agent, meeting: Any, store: Any = None) -> None:
        self.agent, self.meeting, self.store = agent, meeting, store
        cfg = agent.cfg
        self.rank, self.uid, self.pod = cfg.writer, str(cfg.pod_uid), cfg.pod_name
        self.poll_s = max(2.0, cfg.writers / 100)
        self._reported = 0
        self._answered = 0.0
        self._stop = threading.Event()
        #: Set by the resume thread, applied by the agent's loop (apply()):
        #: the agreed decision, once its step is in the work dir, with the
        #: answer the trainer gets after the switch. One value under one lock:
        #: the loop may run apply() at any moment between two lines of
        #: _resume, and must never take the decision without its answer.
        #: It stays set until apply() has written that answer, and no new
        #: round starts meanwhile: the next round's answer (a failure too)
        #: must come after it, and its step must not be one apply() drops.
        self._settled: tuple[Decision, float, resume_channel.Answer] | None = None
        self._lock = threading.Lock()

    # -- the thread ----------------------------------------------------------------
    def start(self) -> None:
        threading.Thread(target=self._loop, name="restore-rounds", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                asked = resume_channel.read_request(self.agent.cfg.work_dir / CONTROL_DIR)
                if asked is not None and asked > self._answered:
                    if self._applying():
                        pass  # its answer comes first
                    elif self.agent.terminating.is_set():
                        self._refuse_stopping()
                    else:
                        self._resume(asked)
                else:
                    self._take_part()
            except meeting_mod.NoRights as err:
                log.warning("restore rounds off: %s", err)
                return
            except Exception as err:  # the apiserver or the disk: try again next poll
                log.warning("restore rounds: %s", err)
            self._stop.wait(self.poll_s)

    def _refuse_stopping(self) -> None:
        """No round once SIGTERM came: the flush would apply none that settles
        after its capture, and the trainer would wait for good. It stops too;
        told at once, it fails loudly instead."""
        started = time.time()
        self._answer(started, resume_channel.Answer(started, False, None, None, "", None,
                                                    "stopping", "the pod is stopping"))
        log.info("a restart in place asked to resume while the pod stops: answered no")

    def abandoning(self) -> int | None:
        """While a settled round waits for apply(): the newest step it keeps
        (-1 for none); every newer one is abandoned, even while still on disk."""
        with self._lock:
            settled = self._settled
        if settled is None:
            return None
        return settled[0].step if settled[0].step is not None else -1

    def _applying(self) -> bool:
        """A settled round waits for the loop: it is the only writer of the
        answer until then."""
        with self._lock:
            return self._settled is not None

    # -- reporting for another rank's round -------------------------------------------
    def holdings(self, round_: int, running: bool = True) -> Report:
        """What this rank holds now: local copies (their timelines) and the
        work dir's complete steps (this timeline's saves); `running`: its
        trainer trains on, and when it has not trained past the step it
        resumed from (it waits for the others), that step pins the round."""
        local: dict[int, str] = {}
        # Read before listing: apply() on the loop's thread switches the
        # timeline only after it dropped the steps the switch abandons.
        tier, cfg, timeline = self.agent.tier, self.agent.cfg, self.agent.timeline or ""
        for step in tier.steps():
            with contextlib.suppress(CkptdrainError, OSError):
                manifest = tier.manifest(step)
                if (manifest.writer, manifest.writers) == (cfg.writer, cfg.writers):
                    local[step] = manifest.extra.get(EXTRA_TIMELINE, "")
        for step in completed_steps(cfg.work_dir):
            local.setdefault(step, timeline)
        pinned = self._waiting_at() if running else None
        return Report(round=round_, rank=self.rank, uid=self.uid, node=cfg.node_name,
                      local=local, pinned=pinned, at=time.time())

    def _waiting_at(self) -> int | None:
        """The step the trainer resumed from, while it has neither saved a
        newer step nor reported a step done past it (progress file)."""
        resumed = self.agent.resumed
        if resumed is None:
            return None
        work = self.agent.cfg.work_dir
        if any(step > resumed for step in completed_steps(work)):
            return None
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads((work / CONTROL_DIR / PROGRESS_FILE).read_bytes())
            step = doc.get("step") if isinstance(doc, dict) else None
            if isinstance(step, int) and step > resumed:
                return None
        return resumed

    def _take_part(self) -> None:
        if self.agent.terminating.is_set():
            return  # a pod on its way out restores nothing, and holds nothing for long
        current, opened, _ = self.meeting.state()
        if opened is None or opened.round <= self._reported or (
                current is not None and current.round >= opened.round):
            return
        own = self.meeting.own_report(self.rank)
        if own is None or own.round < opened.round:
            self.meeting.report(self.holdings(opened.round), self.pod)
            log.info("restore round %d opened by another rank: reported what this rank holds",
                     opened.round)
        self._reported = opened.round

    # -- a restart in place ------------------------------------------------------------
    def _resume(self, asked: float) -> None:
        started = time.time()
        cfg = self.agent.cfg
        complete = self._complete()
        try:
            agreed = meeting_mod.agree(
                self.meeting, rank=self.rank, uid=self.uid, writers=cfg.writers, pod=self.pod,
                report_for=lambda r: self._with_complete(self.holdings(r, running=False),
                                                         complete),
                uncoordinated=complete, timeout_s=cfg.restore_agree_timeout_s,
                in_place_after=self._last_save(asked))
        except meeting_mod.Unsettled as err:
            self._answer(started, resume_channel.Answer(started, False, None, None, "", None,
                                                        "unsettled", str(err)))
            return
        decision = agreed.decision
        try:
            tier = self._place(decision.step, complete) if decision.step is not None else ""
        except (CkptdrainError, OSError) as err:
            self._answer(started, resume_channel.Answer(
                started, False, decision.step, None, "", decision.round, decision.why,
                f"{err}"))
            return
        path = workdir.trainer_path(cfg.trainer_work_dir, decision.step) \
            if decision.step is not None else None
        answer = resume_channel.Answer(started, True, decision.step, path, tier,
                                       decision.round, decision.why, decision.detail)
        if self.agent.terminating.is_set():
            # SIGTERM came while this round ran: the flush may have applied its
            # last round already, and nothing would hand this one over.
            self._answer(started, replace(answer, ok=False, why="stopping",
                                          reason="the pod is stopping"))
            log.info("a restart in place settled while the pod stops: answered no")
            return
        self._answered = started
        with self._lock:
            self._settled = (decision, started, answer)
        log.info("trainer restarted in place: ranks %s step %s in round %d (%s; %s)",
                 agreed.how, decision.step, decision.round, decision.why, decision.detail)

    def _last_save(self, asked: float) -> float:
        """When the trainer last published a step (the rename sets the step
        directory's ctime); the request's time less the wait when it never did."""
        times = []
        for step in completed_steps(self.agent.cfg.work_dir):
            with contextlib.suppress(OSError):
                times.append(step_dir(self.agent.cfg.work_dir, step).stat().st_ctime)
        return max(times) if times else asked - self.agent.cfg.restore_agree_timeout_s

    def _complete(self) -> list[int]:
        if self.store is None:
            return []
        from ckptdrain.transfer.catalog import scan

        with contextlib.suppress(CkptdrainError, OSError):
            return sorted((c.step for c in scan(self.store).complete
                           if c.writers == self.agent.cfg.writers), reverse=True)
        return []

    @staticmethod
    def _with_complete(report: Report, complete: list[int]) -> Report:
        return replace(report, complete=tuple(complete))

    def _place(self, step: int, complete: Collection[int] = ()) -> str:
        """Put `step` in the work dir; the tier it came from. A step in
        `complete` (whole in the global tier) comes from the node only when
        the node's copy is this rank's committed one: a copy another run left
        under that number would put its weights beside the other ranks'."""
        agent = self.agent
        cfg, tier = agent.cfg, agent.tier
        final = step_dir(cfg.work_dir, step)
        # Kept from the moment it is known to be there: the loop prunes work-dir
        # steps older than the tier's newest on its own thread, and would not
        # wait for apply(); under its lock, the step is either still there
        # (and kept) or already gone (and placed again).
        with agent.work_lock:
            if final.is_dir():
                agent.keep_in_work.add(step)
                return "work"
        tmp = cfg.work_dir / f".resume-step-{step}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            manifest = tier.manifest(step) if tier.has(step) else None
            if manifest is not None and step in complete and not self._committed(manifest):
                log.warning("step %d on this node is not the one committed for rank %d "
                            "(another run's copy): taking the committed one", step, cfg.writer)
                manifest = None
            if manifest is not None:
                durable.copy_tree(tier.data_dir(step), tmp, files=[f.path for f in manifest.files],
                                  expected={f.path: f for f in manifest.files})
                used = "local"
            elif self.store is not None:
                from ckptdrain.transfer.fetch import fetch

                fetch(self.store, tmp, step=step, writer=cfg.writer)
                used = "global"
            else:
                raise CkptdrainError(f"step {step} is neither in the work dir nor on this node")
            group_access.share_tree(tmp)  # the trainer may run as any uid of the group
            with agent.work_lock:
                durable.publish(tmp, final)
                agent.keep_in_work.add(step)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return used

    def _committed(self, manifest: WriterManifest) -> bool:
        """Whether the global tier holds `manifest`'s content for its step and rank."""
        from ckptdrain.transfer.catalog import read_manifest

        try:
            held = read_manifest(self.store, keys.manifest_key(manifest.step, manifest.writer))
        except ObjectMissing:
            return False
        except StoreError as err:
            # The store cannot be asked now (and would not serve the step
            # either): the verified node copy serves, as before this check.
            log.warning("cannot ask the global tier whether step %d on this node is rank %d's"
                        " committed copy (%s): using the verified node copy",
                        manifest.step, manifest.writer, err)
            return True
        return held.same_content(manifest)

    def _answer(self, started: float, answer: resume_channel.Answer) -> None:
        self._answered = started
        control.write(self.agent.cfg.work_dir, resume_channel.ANSWER_FILE, answer.to_dict())

    # -- on the agent's loop -------------------------------------------------------------
    def apply(self) -> None:
        """On the agent's own thread (no capture runs meanwhile): drop the
        abandoned steps, switch to the agreed timeline, then answer the trainer.
        An abandoned work-dir step is renamed aside first (it is no step from
        then on), then removed as far as it can be (the prune removes what is
        left later). Raises OSError when a step cannot be renamed aside or
        removed from the local tier, or the answer cannot be written: the round
        stays settled, and the next call does it all again."""
        with self._lock:
            settled = self._settled
        if settled is None:
            return
        decision, started, answer = settled
        agent = self.agent
        keep = decision.step if decision.step is not None else -1
        with agent.work_lock:  # earlier rounds' steps may go now
            agent.keep_in_work.clear()
            if decision.step is not None:
                agent.keep_in_work.add(decision.step)
        if agent.drain is not None:
            agent.drain.abandon_above(keep)
        for step in completed_steps(agent.cfg.work_dir):
            if step > keep:
                _drop_from_work(agent, step)
        for step in agent.tier.steps():
            if step > keep:
                log.warning("dropping local step %d: the ranks resumed from %s", step,
                            decision.step if decision.step is not None else "scratch")
                agent.tier.remove(step)
        # Last: a report (rounds thread) that reads the new timeline finds
        # none of the abandoned steps left to label with it.
        agent.timeline, agent.resumed = decision.timeline, decision.step
        if answer.ok and decision.step is not None and \
                not step_dir(agent.cfg.work_dir, decision.step).is_dir():
            # Nothing of the agent's removes a kept step (work_lock): something
            # else did. The trainer fails loudly and asks again, not loads nothing.
            log.warning("step %d left the work dir before the trainer was answered",
                        decision.step)
            answer = replace(answer, ok=False, reason=f"step {decision.step} is no longer in "
                             "the work dir (removed after it was placed)")
        self._answer(started, answer)
        with self._lock:
            self._settled = None


def _drop_from_work(agent: Agent, step: int) -> None:
    """Rename an abandoned step aside under the prune's name, so it stops being
    a step at once (the prune removes what cannot go now), then remove it.
    Raises OSError when the rename fails."""
    victim = step_dir(agent.cfg.work_dir, step)
    doomed = workdir.aside(agent.cfg.work_dir, step)
    workdir.remove_tree(doomed)  # what an earlier drop of this step left
    more = 0
    while os.path.lexists(doomed):  # it resists: never rename onto it
        more += 1
        doomed = workdir.aside(agent.cfg.work_dir, step, more)
    with agent.work_lock, contextlib.suppress(FileNotFoundError):
        os.rename(victim, doomed)  # any other failure: raised, the round stays settled
    problems = workdir.remove_tree(doomed)
    if problems:
        log.warning("abandoned step %d left the work dir, but %s could not be removed: %s",
                    step, *problems[0])
