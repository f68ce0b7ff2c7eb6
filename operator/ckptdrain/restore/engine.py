"""The restore engine: pick the newest good checkpoint and place it in the work dir.

Candidates come from `restore.plan`: the local tier's steps (verified while
they are copied: every byte's CRC32C against the manifest) and the global
tier's complete steps (fetched with parallel ranged reads at full speed, no
rate limit: the whole job waits for this). A candidate that fails is recorded
in the result's `skipped` with the reason, and the next one is tried. The
work dir is emptied first (restore/workdir.py: it may hold a previous pod's
steps and control files). The chosen step lands in `<work>/step-<N>/` (temp
name, shared with the pod's group, then rename), and the result file says
what came from where, naming the step as the trainer sees it.

Only exit 0 without a step is a fresh start: a step some of whose writers'
manifests are merely missing (still being written, or abandoned) does not
block one, but a policy whose store moved away from checkpoints does, and
neither is a step older than one its history names (CKPTDRAIN_EARLIER_STORES:
outcome `history_elsewhere`, exit 5; restore/elsewhere.py). A
transient failure while fetching the newest step ends that try; it never
falls back to an older step, which would throw progress away (and with
several writers could put ranks on different steps).

With several writers (or readers) a local copy is used only when its manifest
has the same content as this writer's committed global manifest: another pod
that had the same rank may have left other bytes under the same step number.
A reader restores the shard `cfg.writer` like its writer would, and only
reads the local tier. A newest step saved by another writer count is handed
to the trainer instead (restore/reshard.py).

The process around it (configuration, retries, the result file, the
termination message) is restore/command.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from ckptdrain import group_access
from ckptdrain.errors import (
    CkptdrainError,
    IntegrityError,
    ObjectMissing,
    StoreError,
)
from ckptdrain.manifest import WriterManifest
from ckptdrain.node import config as node_config
from ckptdrain.node import durable, space
from ckptdrain.node.localtier import LocalTier
from ckptdrain.node.steps import step_dir
from ckptdrain.restore import coordinated, elsewhere, peer_source, pod_work, reshard, workdir
from ckptdrain.restore.plan import Candidate, Tier, candidates, wrong_writers
from ckptdrain.restore.result import OUTCOMES, RestoreResult, Skipped
from ckptdrain.store.base import Store

log = logging.getLogger("ckptdrain.restore")

#: How the catalog words a writer's manifest that is not there (yet): the one
#: rejection that is normal (a step still being written, or abandoned).
_MISSING = re.compile(r"writer [0-9]+'s manifest is missing$")
SKIPPED_BY_ANNOTATION = "skipped by annotation"


def _global_catalog(store: Any, result: RestoreResult) -> tuple[dict[int, Any], bool]:
    """The store's complete checkpoints by step, and whether a step failed
    verification for a reason other than a missing manifest. Every rejected
    step goes into `result.skipped` with its reason."""
    from ckptdrain.transfer.catalog import scan

    catalog = scan(store)
    blocking = False
    for rejected in catalog.rejected:
        result.skipped.append(Skipped(rejected.step, "global", rejected.reason))
        blocking = blocking or not _MISSING.search(rejected.reason)
    return {c.step: c for c in catalog.complete}, blocking


def _counts(tier: LocalTier, local_steps: list[int], found: dict[int, Any]
            ) -> dict[tuple[Tier, int], int]:
    """Each candidate's writer count. A local manifest that cannot be read is
    left out here: trying it fails with the reason."""
    counts: dict[tuple[Tier, int], int] = {("global", s): c.writers for s, c in found.items()}
    for step in local_steps:
        with contextlib.suppress(CkptdrainError, OSError):
            counts[("local", step)] = tier.manifest(step).writers
    return counts


def _place(tmp: Path, final: Path) -> None:
    """Share `tmp` with the pod's group, whatever tier filled it, then rename
    it to `final` (the work dir was emptied: nothing is there)."""
    group_access.share_tree(tmp)
    durable.publish(tmp, final)


def _from_local(tier: LocalTier, step: int, tmp: Path, writer: int, writers: int,
                committed: WriterManifest | None, agreed: bool = False,
                alone: bool | None = None) -> int:
    """`agreed`: the ranks agreed on this step from what each holds (timelines
    included, restore/agreement.py); without a committed global manifest the
    local copy is then the one to use. `alone`: no other pod restores this
    job's checkpoints (default: one writer), so any local copy of its own will do."""
    manifest = tier.manifest(step)
    if (manifest.writer, manifest.writers) != (writer, writers):
        raise IntegrityError(f"local copy is writer {manifest.writer} of {manifest.writers},"
                             f" this pod is writer {writer} of {writers}")
    alone = writers == 1 if alone is None else alone
    if not alone and ((committed is None and not agreed)
                      or (committed is not None and not manifest.same_content(committed))):
        # Every rank must resume from the same timeline: only the bytes the
        # global commit names will do.
        raise IntegrityError("local copy differs from this writer's committed global manifest "
                             "(other files under the same step); using the global copy")
    space.check_room(tmp.parent, manifest.total_bytes)
    durable.copy_tree(tier.data_dir(step), tmp, files=[f.path for f in manifest.files],
                      expected={f.path: f for f in manifest.files})
    return manifest.total_bytes


def _from_global(store: Any, step: int, writer: int, writers: int, tmp: Path,
                 direct_io: bool = True) -> tuple[int, str, int]:
    """(bytes, how they were written, of which by direct I/O): FetchResult's."""
    from ckptdrain.transfer.catalog import load_checkpoint
    from ckptdrain.transfer.fetch import fetch

    found = load_checkpoint(store, step).writers
    if found != writers:
        raise IntegrityError(f"checkpoint has {found} writer(s), this job has {writers}")
    result = fetch(store, tmp, step=step, writer=writer, direct_io=direct_io)
    if result.step != step:
        raise IntegrityError(f"fetched step {result.step}, asked for {step}")
    return int(result.bytes), result.io, result.direct_bytes


def restore(cfg: node_config.AgentConfig, store: Store | None,
            store_problem: str | None = None) -> tuple[RestoreResult, int]:
    """Restore the best candidate. Returns the result and the exit code.

    `store` is None when no global tier is configured, or when one is but
    could not be opened: then `store_problem` says why.
    """
    started = time.monotonic()
    result = RestoreResult(fresh_start=False, writer=cfg.writer, writers=cfg.writers,
                           at=time.time())
    if not _emptied(cfg, result):
        result.seconds = time.monotonic() - started
        return result, OUTCOMES[result.outcome]
    if store_problem:
        result.skipped.append(Skipped(None, "global", store_problem))
    tier = LocalTier(cfg.local_dir)
    local_steps = tier.steps() if cfg.local_dir.is_dir() else []
    found: dict[int, Any] = {}
    blocking = False
    global_ok = store is not None and store_problem is None
    if global_ok:
        try:
            found, blocking = _global_catalog(store, result)
        except (StoreError, OSError) as err:
            global_ok = False
            result.skipped.append(Skipped(None, "global", f"listing failed: {err}"))
    global_steps = sorted(found, reverse=True)
    counts = _counts(tier, local_steps, found)
    plan = candidates(local_steps, global_steps, writers=cfg.writers,
                      prefer=cfg.restore_prefer, counts=counts,  # type: ignore[arg-type]
                      alone=cfg.restores_alone)
    for cand in wrong_writers(counts, cfg.writers):
        blocking = True
        result.skipped.append(Skipped(
            cand.step, cand.tier, f"checkpoint has {counts[(cand.tier, cand.step)]} writer(s),"
            f" this job has {cfg.writers}"))
    peers, extra = peer_source.candidates(cfg, global_steps, result)
    plan = sorted(plan + extra, key=lambda c: -c.step)  # stable: at one step, peer last but one
    decision, held = None, None
    if coordinated.coordinates(cfg):
        own_peer = peers.held.get(cfg.writer, {}) if peers is not None else {}
        held = coordinated.holdings(cfg, tier, local_steps, counts, global_steps, own_peer)
        try:
            decision = coordinated.agree(cfg, held, result, [c.step for c in extra])
        except coordinated.AgreementPending as err:
            result.outcome, result.reason = "none_verified", str(err)
            result.seconds = time.monotonic() - started
            return result, OUTCOMES[result.outcome]
        if decision is not None:
            plan = coordinated.plan_for(decision, held, decision.step in own_peer,
                                        cfg.restore_prefer)
    elif coordinated.follows(cfg):
        decision = coordinated.follow(cfg, result)
        if decision is not None:  # the writers' step from each tier a reader may use
            plan = [c for c in plan if c.step == decision.step]
    if not cfg.restores_alone and decision is None:
        for step in sorted(set(local_steps) - set(global_steps), reverse=True):
            result.skipped.append(Skipped(
                step, "local", "not complete globally, and ranks could not agree on a step "
                "only the nodes hold" if not cfg.reader and not cfg.readers else
                "not complete globally; readers restore beside the writers, and every pod "
                "must restore one step"))
    handed = _reshard(cfg, store, found, counts, plan, result)
    if handed is not None:
        result.seconds = time.monotonic() - started
        return result, handed
    no_room: list[str] = []
    transient: str | None = None
    older = None  # the step here, and the newer one elsewhere restoring it would lose
    for cand in plan:
        if result.step is not None and cand.step < result.step:
            break
        past = elsewhere.newer(cfg, cand.step)
        if past is not None:
            older = (cand.step, past)
            break
        outcome = _try(cfg, tier, store, cand, result, found.get(cand.step), peers,
                       agreed=decision is not None and not cfg.reader)
        if outcome == "no_room":
            no_room.append(f"step {cand.step} ({cand.tier}): {result.skipped[-1].reason}")
        if outcome == "transient":
            # Not the next candidate: it is older, so the store's answer later
            # is worth more than anything this try could still place.
            transient = f"step {cand.step}: {result.skipped[-1].reason}"
            break
        if outcome == "ok":
            break
    result.seconds = time.monotonic() - started
    # What restore found at all, for a decision of no step (elsewhere.agreed_on_none).
    seen = {*global_steps, *local_steps, *(c.step for c in extra)}
    renew = True  # a failure the next try meets in a new round, not in this decision
    if result.step is not None:
        result.outcome, renew = "restored", False
    elif older is not None:
        result.outcome, result.reason = "history_elsewhere", elsewhere.older_here(cfg, *older)
    elif decision is not None and decision.step is not None and transient is None:
        result.outcome = "none_verified"
        tried = "; ".join(f"{s.tier}: {s.reason}" for s in result.skipped
                          if s.step == decision.step) or "no tier of this rank holds it"
        result.reason = (f"ranks agreed on step {decision.step} (round {decision.round}, "
                         f"{decision.why}) and this rank could not get it: {tried}")
    elif transient is not None:
        result.outcome, renew = "store_unavailable", False
        result.reason = f"the global tier failed mid-restore ({transient})"
    elif no_room:
        result.outcome, renew = "cannot_place", False
        result.reason = f"a checkpoint exists but could not be written to {cfg.work_dir}: " \
            f"{no_room[0]}"
    elif (store is not None or store_problem is not None) and not global_ok:
        result.outcome, renew = "store_unavailable", False
        why = next((s.reason for s in result.skipped if s.step is None), "")
        result.reason = f"the global tier could not be asked ({why}) and nothing local was usable"
    elif plan:
        result.outcome, renew = "none_verified", False
        result.reason = f"{len(plan)} candidate(s) found, none verified"
    elif blocking:
        # Checkpoints exist but none can be trusted: starting fresh would
        # silently throw them away.
        result.outcome, renew = "none_verified", False
        result.reason = "checkpoints exist but failed verification: " + next(
            s.reason for s in result.skipped if s.step is not None
            and not _MISSING.search(s.reason))
    elif cfg.earlier_stores and decision is not None and seen:
        # The ranks' fresh start, made before steps got here (a copy that
        # landed since, a late rank joining): a new round will see them.
        result.outcome = "none_verified"
        result.reason = elsewhere.agreed_on_none(cfg, decision, seen)
    elif cfg.earlier_stores:
        # Nothing here, but the policy's history says checkpoints were: a
        # fresh start would silently throw that training away.
        result.outcome, result.reason = "history_elsewhere", elsewhere.nothing_here(cfg)
    else:
        result.outcome, result.fresh_start, renew = "fresh_start", True, False
    if renew and decision is not None and held is not None:
        coordinated.note_failure(cfg, decision, held)
    return result, OUTCOMES[result.outcome]


def _reshard(cfg: node_config.AgentConfig, store: Any, found: dict[int, Any],
             counts: dict[tuple[Tier, int], int], plan: list[Candidate],
             result: RestoreResult) -> int | None:
    """The exit code when the newest step was saved by another writer count
    (restore/reshard.py): handed to the trainer, or refused; None when the
    plan's best will do."""
    pending = reshard.pending(counts, cfg.writers, plan)
    if pending is None:
        return None
    ckpt = found[pending.step]
    past = elsewhere.newer(cfg, pending.step)
    if past is not None:  # handed over, it would take the trainer back past the history
        result.outcome, result.reason = "history_elsewhere", elsewhere.older_here(
            cfg, pending.step, past)
        return OUTCOMES[result.outcome]
    problem = reshard.refusal(pending, cfg.writers, cfg.restore_reshard, ckpt)
    if problem is not None:
        result.outcome, result.reason = "none_verified", problem
        return OUTCOMES[result.outcome]
    result.skipped = [s for s in result.skipped if (s.step, s.tier) != (pending.step, "global")]
    result.outcome, result.reason = reshard.OUTCOME, reshard.handed_over(pending, cfg.writers)
    result.step, result.tier, result.step_writers = pending.step, "global", pending.writers
    result.source = f"{store.uri} step {pending.step}"
    result.step_created = min((m.created for m in ckpt.manifests), default=None)
    return OUTCOMES[result.outcome]


def _try(cfg: node_config.AgentConfig, tier: LocalTier, store: Any, cand: Candidate,
         result: RestoreResult, ckpt: Any = None,
         peers: peer_source.PeerSource | None = None, agreed: bool = False) -> str:
    """Restore one candidate: "ok", "failed" (try the next), "no_room" (the
    work volume could not take it: full, over quota or read-only), or
    "transient" (the store did not answer: try again later, not the next)."""
    tmp = cfg.work_dir / f".restore-step-{cand.step}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    final = step_dir(cfg.work_dir, cand.step)
    used: str = cand.tier
    # When the step was captured; unknown for a peer's copy (restore_step does
    # not hand back the holder's manifest), and goodput reads None as unknown.
    created: float | None = None
    io: str | None = None
    direct = 0
    try:
        if cand.tier == "peer" and peers is not None:
            size, source, used = peers.restore_step(cand.step, tmp, tier)
        elif cand.tier == "local":
            committed = ckpt.manifests[cfg.writer] if ckpt is not None \
                and cfg.writer < ckpt.writers else None
            size = _from_local(tier, cand.step, tmp, cfg.writer, cfg.writers, committed,
                               agreed, cfg.restores_alone)
            source = str(tier.step_dir(cand.step))
            created = tier.manifest(cand.step).created
        else:
            size, io, direct = _from_global(store, cand.step, cfg.writer, cfg.writers, tmp,
                                            cfg.restore_direct_io)
            source = f"{store.uri} step {cand.step} writer {cfg.writer}"
            created = ckpt.manifests[cfg.writer].created if ckpt is not None \
                and cfg.writer < ckpt.writers else None
        _place(tmp, final)
    except (CkptdrainError, OSError) as err:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = str(err) or type(err).__name__
        log.warning("restore: step %d from the %s tier failed, trying the next candidate: %s",
                    cand.step, cand.tier, reason)
        result.skipped.append(Skipped(cand.step, cand.tier, reason))
        if agreed and cand.tier == "local" and ckpt is None and isinstance(err, IntegrityError):
            # A corrupt copy only the nodes held: worthless, and reported again
            # it would be agreed on again. Gone, the next round passes it by.
            with contextlib.suppress(OSError):
                tier.remove(cand.step)
        if cand.tier == "global" and is_transient(err):
            return "transient"
        return "no_room" if space.is_no_room(err) else "failed"
    result.step, result.tier, result.bytes = cand.step, used, size
    result.name, result.source = final.name, source
    result.path = workdir.trainer_path(cfg.trainer_work_dir, cand.step)
    result.step_created = created
    result.io, result.direct_bytes = io, direct
    return "ok"


def is_transient(err: BaseException) -> bool:
    """A store error that asking again later may cure. A missing object is
    not (the step was deleted, or never complete): the next candidate is."""
    return isinstance(err, StoreError) and not isinstance(err, ObjectMissing)


def _emptied(cfg: node_config.AgentConfig, result: RestoreResult) -> bool:
    """Empty the work dir (restore/workdir.py); False, with the outcome and
    reason set, when something there could not be removed."""
    try:
        removed = workdir.empty(cfg.work_dir, keep_out=(cfg.local_dir,), group=cfg.work_group,
                                pod_dir=pod_work.is_pod_dir(cfg.work_dir, cfg.local_dir))
    except (workdir.NotEmptied, pod_work.ForeignWorkDir) as err:
        result.outcome, result.reason = "cannot_place", str(err)
        return False
    except OSError as err:
        result.outcome = "cannot_place"
        result.reason = f"cannot empty the work dir {cfg.work_dir}: {err}"
        return False
    if removed:
        log.info("restore: emptied the work dir %s of %d entries a previous pod left",
                 cfg.work_dir, removed)
    return True


def skip(cfg: node_config.AgentConfig, outcome: str = "fresh_start",
         reason: str = SKIPPED_BY_ANNOTATION) -> RestoreResult:
    """A deliberate fresh start (the pod's `ckptdrain.io/restore: skip`, or
    restore switched off: `outcome` "disabled"): nothing is placed, and what
    an earlier pod left in the work dir goes, so the trainer and the agent
    see no step of the old timeline. Outcome "cannot_place" when it could
    not go."""
    result = RestoreResult(True, cfg.writer, cfg.writers, time.time(), outcome=outcome,
                           reason=reason)
    if not _emptied(cfg, result):
        result.fresh_start = False
    return result
