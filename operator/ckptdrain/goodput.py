"""Runtime goodput of one policy's job: what checkpointing moves of it. Pure.

Three badputs belong to checkpointing (docs/goodput.md):

- **lost**: training redone after an interruption, from the restored step's
  save to the interruption (`lostSteps` steps, `lostSeconds` seconds);
- **recovery**: from the interruption to training again (pod replacement,
  restore, load);
- **blocked**: time the trainer spent inside `begin()`..`complete()`.

    runtime goodput = 1 - (lost ∪ recovery − waiting + blocked / writers) / available

`available` is the time the job held its resources: from when its first pod
got a node to now (or to when its pods ended), less the time between runs
(`idleSeconds`) and the time spent **waiting for resources**: from each
interruption until its replacement pod got a node (`waitingSeconds`). That
wait is the scheduler's badput, not checkpointing's: it is reported beside
the ratio (`waitingForResourcesSeconds`), not inside it.

Lost, recovery and waiting are wall-clock intervals; each is joined as a
union over every interruption (a lockstep job waits while any rank is down,
and two ranks down at once cost the job that time once). Blocked time is the
mean over writers (ranks checkpoint together).

The inputs are the pods' goodput annotations (contract/goodput.py says who
writes them) and two times from their status; the operator folds them into
`status.goodput` here (bounded: totals, plus the newest MAX_RECENT
interruptions; older ones fold into `earlier`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from ckptdrain.contract.api import as_stored
from ckptdrain.contract.goodput import RESTORED_OUTCOMES, PodView, RestoreView

#: Interruptions kept in the status, newest first; older ones fold into totals.
MAX_RECENT = 10
#: A restore may start a little before the interruption was recorded (the
#: replacement pod can be created while the old one still flushes; clocks of
#: two nodes differ): tolerate this much.
CLOCK_SLACK_S = 5.0
#: Two reports of a pod's interruption this close are one: the agent's time of
#: the SIGTERM, then the trainer's, taken on one node seconds apart. A pod
#: interrupted again (stable LeaderWorkerSet names) restored and trained between.
SAME_INTERRUPTION_S = 120.0


def interruption(pod: PodView, restorable_global: int | None) -> dict[str, Any] | None:
    """A status entry for a pod whose agent recorded an interruption; None if it did not.
    `restorable_global` is the policy's newest complete global step (every writer)."""
    a = pod.agent
    if a is None or a.interrupted_at is None:
        return None
    return {"pod": pod.name, "writer": pod.writer, "at": round(a.interrupted_at, 3),
            "step": a.step, "restorableLocal": a.newest_local,
            "restorableGlobal": restorable_global if restorable_global is not None
            else a.newest_global,
            "stepSeconds": a.step_s,
            # Completion times of the steps a restore may pick, to turn the
            # restored step into lost seconds later; dropped once it is known.
            "completed": {str(s): t for s, t in a.completed},
            "blockedSeconds": round(a.blocked_s, 3)}


def attach(entry: dict[str, Any], pod: PodView) -> dict[str, Any]:
    """The entry with `pod`'s restore (and its training start) filled in.
    Idempotent: attaching the same pod again changes nothing."""
    r = pod.restore
    out = dict(entry)
    if r is None:
        return out
    out.update({"restorePod": pod.name, "restoreOutcome": r.outcome,
                "restoredStep": r.step, "restoredTier": r.tier,
                "restoreStartedAt": round(r.started_at, 3),
                "restoreSeconds": round(r.seconds, 3)})
    if r.failed:
        out["restoreReason"] = r.reason
    else:  # a failed restore's reason does not outlive the retry that succeeded
        out.pop("restoreReason", None)
    at = float(entry["at"])
    out["resourcesAt"] = round(_resources_back(entry, pod, r, at), 3)
    out["waitingSeconds"] = round(out["resourcesAt"] - at, 3)
    step = entry.get("step")
    if r.outcome in RESTORED_OUTCOMES and step is not None:
        restored = -1 if r.step is None else r.step
        out["lostSteps"] = max(0, int(step) - restored)
        # When the restored step was saved: the trainer's own record, else
        # when it was captured (restore read it from the step's manifest).
        done = (entry.get("completed") or {}).get(str(r.step)) if r.step is not None else None
        if not isinstance(done, int | float):
            done = r.step_created
        if isinstance(done, int | float):
            out["lostSeconds"] = round(max(0.0, at - float(done)), 3)
        elif entry.get("lostSeconds") is not None and entry.get("restorePod") == pod.name:
            pass  # computed when the completion times were still at hand
        elif entry.get("stepSeconds") is not None:
            out["lostSeconds"] = round(out["lostSteps"] * float(entry["stepSeconds"]), 3)
        if out.get("lostSeconds") is not None:
            out.pop("completed", None)
    training = pod.agent.training_at if pod.agent is not None else None
    if training is not None and training >= at - CLOCK_SLACK_S:
        out["trainingAt"] = round(training, 3)
        out["recoverySeconds"] = round(max(0.0, training - at), 3)
    return out


def _resources_back(entry: Mapping[str, Any], pod: PodView, r: RestoreView,
                    at: float) -> float:
    """When the job had the interrupted writer's resources again: its
    replacement pod got a node (else, not knowing when, its restore started).
    A failed restore's pod had its node already: the pod that retries after
    it does not move that later, neither when it is attached nor when it is
    attached again (folding is idempotent). Never before the interruption."""
    back = r.started_at if pod.bound_at is None else min(pod.bound_at, r.started_at)
    previous = entry.get("resourcesAt")
    if previous is not None and (entry.get("restorePod") == pod.name
                                 or entry.get("restoreOutcome") not in (None,
                                                                        *RESTORED_OUTCOMES)):
        back = min(back, float(previous))
    return max(at, back)


def keep_interruption(earlier: PodView | None, later: PodView) -> PodView:
    """`later`, a newer view of the same pod, with the interruption `earlier`
    carried if `later` lost it: a pod is never un-interrupted, but an agent
    before this release sent `interruptedAt: null` in its last patch."""
    if (earlier is None or earlier.agent is None or earlier.agent.interrupted_at is None
            or (later.agent is not None and later.agent.interrupted_at is not None)):
        return later
    blocked = max(earlier.agent.blocked_s,
                  later.agent.blocked_s if later.agent is not None else 0.0)
    return dataclasses.replace(later, agent=dataclasses.replace(earlier.agent,
                                                                 blocked_s=blocked))


def _reported_again(listed: Mapping[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`new`, a pod's newest report of its interruption, keeping the restore
    attached to the report `listed` before it (its pod may be gone, and then
    nothing attaches it again), its durations moved to the new time."""
    if listed.get("restorePod") is None:
        return new
    out = {**{k: v for k, v in listed.items() if k not in new}, **new}
    at, moved = float(new["at"]), float(new["at"]) - float(listed["at"])
    if out.get("resourcesAt") is not None:
        out["resourcesAt"] = round(max(at, float(out["resourcesAt"])), 3)
        out["waitingSeconds"] = round(out["resourcesAt"] - at, 3)
    if out.get("trainingAt") is not None:
        out["recoverySeconds"] = round(max(0.0, float(out["trainingAt"]) - at), 3)
    if out.get("lostSeconds") is not None:
        out["lostSeconds"] = round(max(0.0, float(out["lostSeconds"]) + moved), 3)
        out.pop("completed", None)
    if out.get("lostSteps") is not None and new.get("step") is not None:
        restored = -1 if out.get("restoredStep") is None else int(out["restoredStep"])
        out["lostSteps"] = max(0, int(new["step"]) - restored)
    return out


def _matches(entry: Mapping[str, Any], pod: PodView) -> bool:
    return (pod.restore is not None and pod.name != entry.get("pod") and pod.reader is None
            and pod.writer == entry.get("writer")
            and pod.restore.started_at >= float(entry["at"]) - CLOCK_SLACK_S)


def merge(goodput: Mapping[str, Any], pods: Iterable[PodView],
          restorable_global: int | None) -> dict[str, Any]:
    """`status.goodput` after seeing `pods` (live ones and the one an event was
    about). New interruptions enter newest first; each open one takes the
    earliest restore of another pod of the same writer that began after it;
    the oldest beyond MAX_RECENT fold into `earlier`. Idempotent."""
    pods = list(pods)
    recent = [dict(e) for e in goodput.get("recent") or []]
    known = {(e.get("pod"), e.get("at")) for e in recent}
    folded = set(goodput.get("foldedPods") or [])
    for pod in pods:
        entry = interruption(pod, restorable_global)
        if entry is None or (entry["pod"], entry["at"]) in known or pod.name in folded:
            continue
        # The same interruption reported again (the agent's own time first,
        # the trainer's in a later patch) replaces the one listed; a pod's
        # interruption further apart is another one, listed as well.
        listed = next((e for e in recent if e.get("pod") == pod.name
                       and abs(float(e["at"]) - float(entry["at"])) <= SAME_INTERRUPTION_S),
                      None)
        if listed is not None:
            recent.remove(listed)
            entry = _reported_again(listed, entry)
        recent.append(entry)
        known.add((entry["pod"], entry["at"]))
    recent.sort(key=lambda e: float(e["at"]), reverse=True)
    for i, entry in enumerate(recent):
        # A restore belongs to the newest interruption of its writer before it.
        newer = min((float(e["at"]) for e in recent[:i] if e.get("writer") == entry.get("writer")),
                    default=math.inf)
        candidates = sorted((p for p in pods if _matches(entry, p)
                             and p.restore is not None and p.restore.started_at < newer),
                            key=lambda p: p.restore.started_at)  # type: ignore[union-attr]
        attached = entry.get("restorePod")
        chosen = next((p for p in candidates if p.name == attached), None)
        # A successful restore, once attached, is the answer for good: when
        # its pod is gone it is no longer among `pods`, and the next pod of
        # the writer restores after an interruption of its own (were that one
        # ever missed, it must not move this entry to a later restore). A
        # failed or missing one gives way to the earliest that followed.
        # Kept only while no newer interruption of the writer, seen since,
        # comes before it (then it was that one's restore).
        kept = (attached and entry.get("restoreOutcome") in RESTORED_OUTCOMES
                and float(entry.get("restoreStartedAt") or math.inf) < newer)
        if chosen is None and not kept:
            chosen = candidates[0] if candidates else None
        if chosen is not None:
            recent[i] = attach(entry, chosen)
    earlier = dict(goodput.get("earlier") or {})
    while len(recent) > MAX_RECENT:
        old = recent.pop()
        folded.add(str(old.get("pod")))
        _fold(earlier, old, recent)
    out = {k: v for k, v in goodput.items() if k not in ("recent", "earlier", "foldedPods")}
    out["recent"] = recent
    if earlier:
        out["earlier"] = earlier
    if folded:
        out["foldedPods"] = sorted(folded)[-MAX_RECENT:]
    out.update(_held(goodput, pods, recent))
    return out


def _holding(pod: PodView) -> bool:
    """Whether the pod holds its resources for training now: not ended, not
    interrupted (an interrupted one's writer waits for its replacement)."""
    return not pod.finished and (pod.agent is None or pod.agent.interrupted_at is None)


def _held(goodput: Mapping[str, Any], pods: list[PodView],
          recent: list[dict[str, Any]]) -> dict[str, Any]:
    """When the job first held resources (`heldSince`: its earliest pod on a
    node), when its pods all ended (`endedAt`, while none holds any), and the
    time between an end and the next pod on a node (`idleSeconds`): the
    bounds of the ratio's denominator. Idempotent."""
    out: dict[str, Any] = {}
    bound = [p.bound_at for p in pods if p.bound_at is not None]
    since = goodput.get("heldSince")
    # A status folded before the start was recorded keeps counting from the
    # policy's creation: the pods seen now are not the job's first.
    if bound and (since is not None or not (goodput.get("recent") or goodput.get("earlier"))):
        out["heldSince"] = round(min([*bound, *([float(since)] if since is not None else [])]),
                                 3)
    ended = goodput.get("endedAt")
    holding = [p for p in pods if _holding(p)]
    if ended is not None and holding:
        # The job runs again: the time its pods had no node is not its own.
        back = [p.bound_at for p in holding if p.bound_at is not None
                and p.bound_at >= float(ended)]
        if back:
            out["idleSeconds"] = round(float(goodput.get("idleSeconds") or 0)
                                       + min(back) - float(ended), 3)
        out["endedAt"] = None
    elif not holding and pods and all(e.get("recoverySeconds") is not None for e in recent):
        # Every pod ended and no interruption waits for a replacement: done.
        ends = [p.finished_at for p in pods if p.finished_at is not None]
        if ends:
            out["endedAt"] = round(max([*ends, *([float(ended)] if ended is not None
                                                  else [])]), 3)
    return out


def badput_interval(entry: Mapping[str, Any]) -> tuple[float, float] | None:
    """[interruption - lost seconds, training again] of one interruption; None while open."""
    if entry.get("recoverySeconds") is None:
        return None
    at = float(entry["at"])
    return at - float(entry.get("lostSeconds") or 0.0), at + float(entry["recoverySeconds"])


def waiting_interval(entry: Mapping[str, Any], now: float) -> tuple[float, float]:
    """[interruption, replacement on a node] of one interruption: until `now`
    while no replacement has a node yet (empty for an entry closed before
    the wait was recorded)."""
    at = float(entry["at"])
    back = entry.get("resourcesAt")
    if back is None:
        return at, at if entry.get("recoverySeconds") is not None else max(at, now)
    return at, max(at, float(back))


def union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def _fold(earlier: dict[str, Any], old: Mapping[str, Any], rest: list[dict[str, Any]]) -> None:
    """Add an entry leaving the list to the running totals; its badput counts
    only where no entry still listed covers it."""
    earlier["interruptions"] = int(earlier.get("interruptions", 0)) + 1
    for key in ("lostSteps", "lostSeconds", "recoverySeconds", "blockedSeconds"):
        earlier[key] = round(float(earlier.get(key, 0)) + float(old.get(key) or 0), 3)
    mine = badput_interval(old)
    if mine is not None:
        kept = [iv for e in rest if (iv := badput_interval(e)) is not None]
        alone = union_seconds([mine, *kept]) - union_seconds(kept)
        earlier["badputSeconds"] = round(float(earlier.get("badputSeconds", 0)) + alone, 3)
    if old.get("resourcesAt") is not None:
        waits = [waiting_interval(e, float(e["at"])) for e in rest]
        alone = union_seconds([waiting_interval(old, 0.0), *waits]) - union_seconds(waits)
        earlier["waitingForResourcesSeconds"] = round(
            float(earlier.get("waitingForResourcesSeconds", 0)) + alone, 3)
    if old.get("restoreOutcome") not in (None, *RESTORED_OUTCOMES):
        earlier["failedRestores"] = int(earlier.get("failedRestores", 0)) + 1


def totals(goodput: Mapping[str, Any], since: float, now: float, writers: int,
           live_blocked_s: float) -> dict[str, Any]:
    """The rolled-up numbers: sums over `recent` and `earlier`, the time the job
    held its resources (from `heldSince`, else `since`: the policy's creation),
    the time it waited for them, and the runtime goodput over the former.
    `live_blocked_s` is the sum of the blocked seconds of the pods alive now
    (ended pods' are in the entries)."""
    recent = list(goodput.get("recent") or [])
    earlier = goodput.get("earlier") or {}

    def total(key: str) -> float:
        return float(earlier.get(key, 0)) + sum(float(e.get(key) or 0) for e in recent)

    blocked = total("blockedSeconds") + live_blocked_s
    start = float(goodput["heldSince"]) if goodput.get("heldSince") is not None else since
    end = max(start, now if goodput.get("endedAt") is None else float(goodput["endedAt"]))

    def clipped(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
        # Only what happened while the job ran counts against its time.
        return [(max(lo, start), min(hi, end)) for lo, hi in intervals
                if min(hi, end) > max(lo, start)]

    waits = clipped(waiting_interval(e, end) for e in recent)
    lost = clipped(iv for e in recent if (iv := badput_interval(e)) is not None)
    waiting = union_seconds(waits)
    # The interruptions' lost and recovery time while the job had its
    # resources: their union less the waits inside it.
    interruption_badput = max(0.0, float(earlier.get("badputSeconds", 0))
                              - float(earlier.get("waitingForResourcesSeconds", 0))) \
        + union_seconds(lost + waits) - waiting
    waiting += float(earlier.get("waitingForResourcesSeconds", 0))
    available = max(0.0, end - start - float(goodput.get("idleSeconds") or 0) - waiting)
    badput = interruption_badput + blocked / max(1, writers)
    ratio = None if available <= 0 else max(0.0, min(1.0, 1.0 - badput / available))
    wall = max(0.0, now - since)
    return {
        "interruptions": int(earlier.get("interruptions", 0)) + len(recent),
        "open": sum(1 for e in recent if e.get("recoverySeconds") is None),
        "lostSteps": int(total("lostSteps")),
        "lostSeconds": round(total("lostSeconds"), 3),
        "recoverySeconds": round(total("recoverySeconds"), 3),
        "blockedSeconds": round(blocked, 3),
        "badputSeconds": round(badput, 3),
        "availableSeconds": round(available, 3),
        "waitingForResourcesSeconds": round(waiting, 3),
        "wallSeconds": round(wall, 3),
        "runtimeGoodput": None if ratio is None else round(ratio, 6),
        "failedRestores": int(earlier.get("failedRestores", 0)) + sum(
            1 for e in recent if e.get("restoreOutcome") not in (None, *RESTORED_OUTCOMES)),
    }


def status_patch(current: Mapping[str, Any], pods: Iterable[PodView],
                 restorable_global: int | None, since: float, now: float, writers: int,
                 live_blocked_s: float) -> dict[str, Any] | None:
    """The new `status.goodput`, or None when only the clock or the blocked
    seconds moved: the status is rewritten at interruptions and restores, not
    at every checkpoint of every writer (`ckptdrain goodput` computes the live
    figures from the pods)."""
    merged = merge(current, pods, restorable_global)
    # Kept, and compared, as the apiserver stores it: without a figure that
    # is not known (a fresh start's restored step); a key dropped here is
    # named null in the patch (sync.replacing).
    new: dict[str, Any] = as_stored({**merged, **totals(merged, since, now, writers,
                                                        live_blocked_s)})
    if new.get("recent"):
        new["lastInterruption"] = summary(new["recent"][0])
    drifting = ("wallSeconds", "runtimeGoodput", "badputSeconds", "blockedSeconds",
                "availableSeconds", "waitingForResourcesSeconds")
    same = all(current.get(k) == new.get(k) for k in {*current, *new} if k not in drifting)
    return None if same and current else new


def summary(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The short form of one interruption, for `lastInterruption`."""
    keys = ("pod", "writer", "at", "step", "restoredStep", "restoredTier", "lostSteps",
            "lostSeconds", "waitingSeconds", "recoverySeconds", "restoreOutcome",
            "restoreReason")
    return {k: entry[k] for k in keys if entry.get(k) is not None}
