"""The agent's SIGTERM flush (agent/loop.py runs it when SIGTERM ends its loop).

Within grace − safety margin:
1. apply a settled restore round (agent/rounds.py: its abandoned steps are
   not captured), stop the drain of anything older than what is captured;
2. give the trainer's emergency checkpoint a moment to appear, apply a round
   that settled meanwhile (agent/rounds.py opens none after SIGTERM: no
   later one could be applied), capture the newest published step durably
   (temp + fsync + rename), then apply a round that settled during the capture
   (a step it abandons is neither submitted nor drained);
3. drain it with top priority until the deadline, then cancel: the engine's
   journal keeps finished parts for whoever runs next on this node;
4. return, so the process exits 0 before the deadline.
A round that cannot be applied (its answer cannot be written on a full disk)
is counted and logged, and the flush goes on: the capture matters more. A
second SIGTERM aborts whatever is in progress at once; because captures are
published by rename, that never leaves a corrupt local copy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ckptdrain.agent.report import CheckpointEvent, State
from ckptdrain.errors import CkptdrainError
from ckptdrain.node.durable import CopyAborted
from ckptdrain.node.steps import is_writing

if TYPE_CHECKING:
    from ckptdrain.agent.loop import Agent

log = logging.getLogger(__name__)

#: How often the flush looks at the work dir and the drain.
POLL = 0.1
#: After SIGTERM, how long to wait for the trainer to *start* an emergency checkpoint.
EMERGENCY_SETTLE = 1.0
#: Share of the flush budget we are willing to wait for it to *finish*.
EMERGENCY_SHARE = 0.5


def flush(agent: Agent) -> int:
    """Capture and drain the newest step before the deadline; returns the exit code (0)."""
    start = agent.sigterm_at if agent.sigterm_at is not None else agent.clock()
    deadline = start + agent.cfg.flush_budget_s
    log.info("SIGTERM: flushing for up to %.1fs", deadline - agent.clock())

    def stop_now() -> bool:
        return agent.aborting.is_set() or agent.clock() >= deadline

    agent.apply_round()
    agent.request("sigterm")  # for trainers that poll instead of handling SIGTERM
    await_emergency(agent, start, deadline, stop_now)
    agent.apply_round()  # a round opened before SIGTERM that settled meanwhile
    newest: int | None = None
    try:
        newest = agent.capture_newest("sigterm", should_stop=stop_now)
    except CopyAborted:
        log.warning("SIGTERM capture stopped (deadline or a second SIGTERM); "
                    "nothing half-copied was published")
    except (CkptdrainError, OSError) as err:
        log.warning("SIGTERM capture failed: %s", err)
    if agent.goodput is not None:
        agent.goodput.interrupted(time.time() - (agent.clock() - start))
    agent.apply_round()  # a round that settled during the capture: applied before draining
    target = _target(agent, newest)
    drain = agent.drain
    bound = agent.rounds.abandoning() if agent.rounds is not None else None
    if drain is not None and bound is not None:
        drain.abandon_above(bound)  # still not applied: nothing it abandons drains
    if drain is not None and target is not None and not agent.tier.is_global(target):
        drain.submit(target, "sigterm")  # newest: supersedes anything older
        while not stop_now() and not drain.is_done(target):
            agent.metrics.beat()
            time.sleep(POLL)
    if drain is not None:
        # Leave a moment for the cancelled part to finish and the journal to land.
        remaining = 0.5 if agent.aborting.is_set() else max(0.1, deadline - agent.clock())
        if not drain.stop(timeout=remaining):
            log.warning("drain did not stop before the deadline; its journal resumes it")
    if agent.goodput is not None:
        agent.goodput.close(timeout=max(0.1, deadline - agent.clock()))
    if target is not None:
        _say_done(agent, target)
    return 0


def _target(agent: Agent, newest: int | None) -> int | None:
    """The step to drain: the one just captured (unless a round applied since
    dropped it), else the newest local one; not one that a round the flush could
    not apply abandons (it stays local, unsent)."""
    local = agent.tier.steps()
    target = newest if newest in local else (local[0] if local else None)
    bound = agent.rounds.abandoning() if agent.rounds is not None else None
    if bound is not None and target is not None and target > bound:
        log.warning("a restore round is not applied: step %d it abandons is not drained",
                    target)
        target = max((s for s in local if s <= bound), default=None)
    return target


def _say_done(agent: Agent, target: int) -> None:
    state = "global" if agent.tier.is_global(target) else "local only (journaled)"
    log.info("SIGTERM flush done: step %d is %s", target, state)
    if agent.drain is not None and agent.drain.last_error and state != "global":
        # This pod's retries end here: Retrying would claim an attempt
        # that nobody is making any more.
        agent.reporter.report(CheckpointEvent(
            target, State.FAILED, trigger="sigterm",
            message=f"drain given up when the pod stopped: {agent.drain.last_error}; "
            f"the local copy and its journal stay on node {agent.cfg.node_name or '?'}"
            " for the next agent there"))


def await_emergency(agent: Agent, start: float, deadline: float,
                    stop_now: Callable[[], bool]) -> None:
    """Wait briefly for the trainer's emergency checkpoint: long enough for it to start
    (EMERGENCY_SETTLE), and while a `.tmp` is being written, up to half the flush budget."""
    budget_end = start + EMERGENCY_SHARE * (deadline - start)
    settle_end = min(start + EMERGENCY_SETTLE, budget_end)
    while not stop_now():
        now = agent.clock()
        writing = is_writing(agent.cfg.work_dir)
        if now >= budget_end or (now >= settle_end and not writing):
            return
        agent.metrics.beat()
        time.sleep(POLL / 2)
