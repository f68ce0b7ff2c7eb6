"""Restore with several writers: this rank's part of the job-wide agreement.

The engine (restore/engine.py) asks here for the one step this rank may
restore. This rank reports what it can get (its node's local copies with
their timelines, what its peer holders keep for it, what it saw complete in
the global tier), the meeting (restore/meeting.py, rules in
restore/agreement.py) settles a step for every rank, and the engine then
tries only that step, from each tier that has it: a failure never falls back
to another step. When coordination cannot happen (one writer, not in a pod,
no rights on Leases, an apiserver that never answered) the engine's plan
without it applies: with several writers, the newest globally complete step.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ckptdrain.errors import CkptdrainError
from ckptdrain.manifest import EXTRA_TIMELINE
from ckptdrain.node import config as node_config
from ckptdrain.node.localtier import LocalTier
from ckptdrain.restore.agreement import Decision, Report
from ckptdrain.restore.plan import Candidate, Tier
from ckptdrain.restore.result import RestoreResult, Skipped

log = logging.getLogger("ckptdrain.restore")


class AgreementPending(CkptdrainError):
    """This rank may restore nothing yet: the step its round agreed on could
    not be got here, and the other ranks have not come back to agree again."""



@dataclass(frozen=True)
class Holdings:
    """What this rank can get, as it reports it."""

    local: Mapping[int, str]
    peer: tuple[int, ...]
    complete: tuple[int, ...]


def holdings(cfg: node_config.AgentConfig, tier: LocalTier, local_steps: Iterable[int],
             counts: Mapping[tuple[Tier, int], int], global_steps: Iterable[int],
             peer_held: Iterable[int]) -> Holdings:
    """Local copies that are this rank's (its writer id, the job's writer count),
    with their timelines; a manifest that cannot be read is not held. A global
    step saved by another writer count is no shard of this job's (restore
    hands it over resharded: restore/reshard.py). With readers beside the
    writers, a copy only the nodes hold is not offered: a reader could not
    get it, and the job would part."""
    complete = [s for s in global_steps if counts.get(("global", s)) == cfg.writers]
    local: dict[int, str] = {}
    for step in local_steps:
        if counts.get(("local", step)) != cfg.writers:
            continue
        if cfg.readers and step not in complete:
            continue
        with contextlib.suppress(CkptdrainError, OSError):
            manifest = tier.manifest(step)
            if manifest.writer == cfg.writer:
                local[step] = manifest.extra.get(EXTRA_TIMELINE, "")
    return Holdings(local, tuple(sorted(set(peer_held), reverse=True)),
                    tuple(sorted(set(complete), reverse=True)))


def coordinates(cfg: node_config.AgentConfig) -> bool:
    """Whether this restore takes part in an agreement. A reader does not: it
    holds no rank, and the writers offer only steps it can get."""
    return cfg.writers > 1 and cfg.restore_agree_timeout_s > 0 and bool(cfg.pod_uid) \
        and node_config.in_cluster(cfg) and not cfg.reader


def agree(cfg: node_config.AgentConfig, held: Holdings, result: RestoreResult,
          uncoordinated: Iterable[int] = (), meeting: Any = None) -> Decision | None:
    """The decision for this rank, or None when coordination could not happen
    (the reason goes into `result.skipped`). `uncoordinated`: the steps the
    plan without coordination would restore (global, peer-made-whole), for
    the fall-back."""
    from ckptdrain.restore import meeting as meeting_mod

    def report_for(round_: int) -> Report:
        return Report(round=round_, rank=cfg.writer, uid=str(cfg.pod_uid), node=cfg.node_name,
                      local=dict(held.local), peer=held.peer, complete=held.complete,
                      at=time.time())

    try:
        meet = meeting if meeting is not None else meeting_mod.Meeting(cfg.namespace, cfg.policy)
        agreed = meeting_mod.agree(meet, rank=cfg.writer, uid=str(cfg.pod_uid),
                                   writers=cfg.writers, pod=cfg.pod_name,
                                   report_for=report_for,
                                   uncoordinated=[*held.complete, *uncoordinated],
                                   timeout_s=cfg.restore_agree_timeout_s)
    except meeting_mod.Unsettled as err:
        raise AgreementPending(str(err)) from None
    except meeting_mod.NoRights as err:
        result.skipped.append(Skipped(None, "agreement", f"ranks cannot coordinate ({err}); "
                                      "restoring the newest step complete in the global tier"))
        return None
    except Exception as err:  # the apiserver never answered
        result.skipped.append(Skipped(None, "agreement", f"the apiserver could not be asked "
                                      f"({err}); restoring the newest step complete in the "
                                      "global tier"))
        return None
    decision = agreed.decision
    result.agreement = {"round": decision.round, "step": decision.step, "why": decision.why,
                        "detail": decision.detail, "how": agreed.how,
                        "waited": round(agreed.waited_s, 3), "roundWhy": agreed.round_why}
    result.timeline = decision.timeline
    log.info("restore: ranks %s step %s in round %d (%s; %s)", agreed.how,
             decision.step, decision.round, decision.why, decision.detail)
    return decision


def plan_for(decision: Decision, held: Holdings, peer_offered: bool,
             prefer: str) -> list[Candidate]:
    """The agreed step from every tier this rank can get it from, best first."""
    step = decision.step
    if step is None:
        return []
    tiers: list[Tier] = []
    if step in held.local:
        tiers.append("local")
    if peer_offered:
        tiers.append("peer")
    if step in held.complete:
        tiers.insert(0 if prefer == "global" else len(tiers), "global")
    return [Candidate(step, t) for t in tiers]


def note_failure(cfg: node_config.AgentConfig, decision: Decision, held: Holdings,
                 meeting: Any = None) -> None:
    """This pod could not get the agreed step (or, for a decision of no step,
    could not start fresh): say so on its report, so its next try starts a
    new round instead of joining the same decision again."""
    from ckptdrain.restore import meeting as meeting_mod

    try:
        meet = meeting if meeting is not None else meeting_mod.Meeting(cfg.namespace, cfg.policy)
        meet.report(replace(Report(round=decision.round, rank=cfg.writer, uid=str(cfg.pod_uid),
                                   node=cfg.node_name, local=dict(held.local), peer=held.peer,
                                   complete=held.complete, at=time.time()),
                            failed=decision.step, failed_fresh=decision.step is None),
                    cfg.pod_name)
    except Exception as err:  # the next round then waits for the join window
        log.warning("restore: could not record the failed step on this rank's report: %s", err)


def follows(cfg: node_config.AgentConfig) -> bool:
    """Whether this restore follows the writers' decision: a reader, in a pod."""
    return cfg.reader and cfg.restore_agree_timeout_s > 0 and node_config.in_cluster(cfg)


def follow(cfg: node_config.AgentConfig, result: RestoreResult, meeting: Any = None,
           clock: Any = time.time, monotonic: Any = time.monotonic,
           sleep: Any = time.sleep) -> Decision | None:
    """A reader's step: the writers' decision. It waits (at most the
    agreement's bound) while the writers' round is open, or while their
    newest decision is older than the reader's start less the bound (the
    writers of the same gang restart have not decided yet); then it takes
    the newest decision there is. None (the plan without coordination) when
    there is none or the apiserver could not be asked."""
    from ckptdrain.restore import meeting as meeting_mod

    started, deadline = clock(), monotonic() + cfg.restore_agree_timeout_s
    try:
        meet = meeting if meeting is not None else meeting_mod.Meeting(cfg.namespace, cfg.policy)
        while True:
            current, opened, _ = meet.state()
            pending = opened is not None and (current is None or opened.round > current.round)
            fresh = current is not None and current.decided_at >= started \
                - cfg.restore_agree_timeout_s
            if (fresh and not pending) or monotonic() >= deadline:
                break
            sleep(max(1.0, cfg.writers / 500))
    except Exception as err:  # no rights, or no apiserver: the plan without coordination
        result.skipped.append(Skipped(None, "agreement", f"the writers' decision could not be "
                                      f"read ({err}); restoring what every pod can get"))
        return None
    if current is None:
        return None
    result.agreement = {"round": current.round, "step": current.step, "why": current.why,
                        "detail": current.detail, "how": "followed",
                        "waited": round(clock() - started, 3), "roundWhy": "a reader"}
    result.timeline = current.timeline
    return current
