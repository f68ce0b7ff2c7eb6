"""Ranks agree on one restore step, the newest every rank can get. Pure.

With several writers every rank must resume from the same step, and a rank
sees only its own node's local tier (and, with the peer tier on, the copies
its holders keep for it). So each rank *reports* what it can get, and one
*decision* names the step for all of them. Both are Leases in the training
namespace (restore/meeting.py makes the calls); this module holds the rules.

    ckptdrain-<policy>-r<rank>   a rank's report: its pod uid, the round it
                                 reports in, the steps it can get (own node,
                                 its peer holders) with their timelines, the
                                 steps it saw complete in the global tier
    ckptdrain-<policy>-restore   the decision: round, step (None: fresh
                                 start), why, the members (rank -> pod uid)
                                 whose reports it rests on, its timeline id

Rounds. The decision carries a round number; a restoring rank either joins
the current decision or starts round `decision.round + 1`, so every rank of
one gang restart computes the same round number from what it reads. It
joins when its own pod already took part (an init container retried), or
when its rank took no part and the decision is younger than the join window
(a rank that started late into a fallback: it then records itself among the
members). It starts a new round when its rank's previous pod took part (a
new pod generation), when its own try of the decided step failed, or when
the decision is older than the window. A report is owned by its pod, so
the garbage collector deletes it with the pod: a dead pod's report is not
counted in a later round.
A report from another round is never counted: a stale rank from an earlier
generation cannot vote. A pod that could not get its round's step reports
in the next round but never writes its fall-back: the other ranks restored
that step and may be running, so it waits (failing, and retried) until they
come back and agree again; alone it never settles on another step.

Who reports. Every restoring rank reports (a pod starting, or a trainer
restarted inside its pod, through its agent), and so does every *running*
rank's agent once a round is open: a pod replaced while the others train on
learns at once what they hold, instead of waiting out the bound. The first
restoring rank of a round marks it open on the decision's Lease (`Opened`).

Deciding. The rank that opened the round (and rank 0, when it restores)
reads the round's reports; once every rank reported, the step is the newest
one every rank can get from its own node, a peer, or the global tier
(`agreed_step`). When not every rank reports within the
bounded wait, any rank of the round writes the fall-back decision: what
restore does without coordination (the newest step complete in the global
tier, or made whole by the peer tier, which every rank sees alike). A decision is written with the
resourceVersion read, so exactly one is made per round; whoever loses the
race reads and adopts the winner's. Ranks never end on different steps.

Timelines. A rank trained on from a restored step writes new checkpoints
under step numbers an abandoned timeline may have used on some node. Each
decision has a timeline id, every local copy records the timeline it was
captured in (the agent tags it), and a step held only on nodes counts only
when every rank's copy has the same timeline. A step in the global tier is
one timeline by its commit (a local copy of it is used only when its content
equals the committed manifest).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ckptdrain.jsonfile import parse_object

#: How many of its newest steps a rank reports per source (a report is an
#: annotation: small, whatever the retention).
REPORT_STEPS = 16
#: A rank that took no part in a decision joins it within this many seconds
#: of it being made (a pod of the same gang restart that started late), when
#: the decision is at least this old and was made without it, it starts a
#: new round instead.
JOIN_WINDOW_S = 600.0

Move = Literal["join", "report", "wait"]


@dataclass(frozen=True)
class Report:
    """What one rank can get, in one round."""

    round: int
    rank: int
    uid: str
    node: str = ""
    #: step -> timeline of this rank's own node's copy ("" when untagged).
    local: Mapping[int, str] = field(default_factory=dict)
    #: Steps the peer tier's holders keep for this rank.
    peer: tuple[int, ...] = ()
    #: Steps this rank saw complete in the global tier.
    complete: tuple[int, ...] = ()
    #: A decided step this pod could not get: its next try starts a new round.
    failed: int | None = None
    #: From a running rank's agent: the step its trainer resumed from and has
    #: not trained past (it waits for the others, at a rendezvous). The round
    #: may then agree on that step only: any other would mix two states.
    pinned: int | None = None
    at: float = 0.0
    #: A decided fresh start (no step) this pod could not take (its policy's
    #: history names checkpoints elsewhere): like `failed`, for no step.
    failed_fresh: bool = False

    def failed_on(self, decision: Decision) -> bool:
        """Whether this report says its pod could not take `decision`'s step."""
        if decision.step is None:
            return self.failed_fresh
        return self.failed is not None and self.failed == decision.step

    def to_json(self) -> str:
        return json.dumps({
            "round": self.round, "rank": self.rank, "uid": self.uid, "node": self.node,
            "local": {str(s): t for s, t in _newest(self.local)},
            "peer": sorted(self.peer, reverse=True)[:REPORT_STEPS],
            "complete": sorted(self.complete, reverse=True)[:REPORT_STEPS],
            "failed": self.failed, "pinned": self.pinned, "at": round(self.at, 3),
            **({"failedFresh": True} if self.failed_fresh else {}),
        }, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: object) -> Report | None:
        """None for anything that is not a well-formed report (never trusted
        beyond its shape: a malformed one counts as no report)."""
        doc = _doc(text)
        if doc is None:
            return None
        try:
            local = doc.get("local") or {}
            if not isinstance(local, dict):
                return None
            report = cls(
                round=_whole(doc["round"]), rank=_whole(doc["rank"]), uid=str(doc["uid"]),
                node=str(doc.get("node", "")),
                local={_whole(int(s)): str(t) for s, t in local.items()},
                peer=tuple(_whole(s) for s in doc.get("peer") or ()),
                complete=tuple(_whole(s) for s in doc.get("complete") or ()),
                failed=None if doc.get("failed") is None else _whole(doc["failed"]),
                pinned=None if doc.get("pinned") is None else _whole(doc["pinned"]),
                at=float(doc.get("at", 0.0)), failed_fresh=doc.get("failedFresh") is True)
        except (KeyError, TypeError, ValueError):
            return None
        return report if report.uid else None


@dataclass(frozen=True)
class Decision:
    """The step every rank of `round` restores (None: a fresh start)."""

    round: int
    step: int | None
    #: "agreed" (every rank reported) or "fallback" (the wait ran out).
    why: str
    detail: str
    members: Mapping[int, str]
    decided_at: float
    timeline: str

    def member(self, rank: int) -> str | None:
        """The digest of the pod that took part as `rank` (None: none did)."""
        return self.members.get(rank) or None

    def with_member(self, rank: int, uid: str) -> Decision:
        """This decision with `uid` recorded as rank `rank`'s pod: a rank that
        joins late is a member, so its next pod starts a new round."""
        return Decision(self.round, self.step, self.why, self.detail,
                        {**self.members, rank: pod_digest(uid)}, self.decided_at, self.timeline)

    def to_json(self) -> str:
        return json.dumps({
            "round": self.round, "step": self.step, "why": self.why, "detail": self.detail,
            # A list by rank of short digests: 5,000 members fit in ~60 KB.
            "members": [self.members.get(r, "") for r in range(max(self.members, default=-1)
                                                                  + 1)],
            "decidedAt": round(self.decided_at, 3), "timeline": self.timeline,
        }, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: object) -> Decision | None:
        doc = _doc(text)
        if doc is None:
            return None
        try:
            members = doc.get("members") or []
            if not isinstance(members, list):
                return None
            step = doc.get("step")
            return cls(round=_whole(doc["round"]), step=None if step is None else _whole(step),
                       why=str(doc["why"]), detail=str(doc.get("detail", "")),
                       members={r: str(u) for r, u in enumerate(members) if u},
                       decided_at=float(doc["decidedAt"]), timeline=str(doc["timeline"]))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Next:
    """What a restoring rank does: join `decision`, report in `round` (a new
    round, or its own round still undecided), and then wait for its decision."""

    move: Move
    round: int
    decision: Decision | None = None
    why: str = ""
    #: False when this pod could not get its round's step: the other ranks
    #: restored it and may be running, so this pod alone must never settle
    #: on another step. It reports and waits for them to come back.
    may_fall_back: bool = True


def next_move(decision: Decision | None, own: Report | None, rank: int, uid: str,
              now: float, join_window: float = JOIN_WINDOW_S) -> Next:
    """Join the current decision or report in a round (module docstring)."""
    current = decision.round if decision is not None else 0
    mine = own is not None and own.uid == uid
    if mine and own is not None and own.round > current:
        return Next("wait", own.round, why="this pod reported in a round not decided yet",
                    may_fall_back=own.failed is None and not own.failed_fresh)
    new = Next("report", current + 1)
    if decision is None:
        return Next("report", 1, why="no decision yet")
    member = decision.member(rank)
    young = 0 <= now - decision.decided_at <= join_window
    if member == pod_digest(uid):
        if mine and own is not None and own.round == decision.round \
                and own.failed_on(decision):
            what = "start fresh" if decision.step is None else f"get step {decision.step}"
            return Next("report", current + 1, why=f"this pod could not {what}",
                        may_fall_back=False)
        if young:
            return Next("join", current, decision, "this pod took part")
        # Its init containers run again long after (a node that rebooted
        # under the pod): the others have trained on; ask them anew.
        return Next(new.move, new.round, why="this pod took part, long ago")
    if member is not None:
        return Next(new.move, new.round, why="a previous pod of this rank took part")
    if young:
        return Next("join", current, decision, "made without this rank, moments ago")
    return Next(new.move, new.round, why="the decision is older than the join window")


def next_move_in_place(decision: Decision | None, own: Report | None, rank: int, uid: str,
                       fresh_after: float) -> Next:
    """For a trainer restarted inside its pod (the agent asks for it): join a
    decision this pod took part in that was made after `fresh_after` (this
    rank's newest save: a decision made since is one the other ranks took
    after the same failure, while this trainer could not train on), else
    report in a new round. A decision made before that save (the one made
    when the pod started, say) is never the answer: the trainer trained past
    it."""
    current = decision.round if decision is not None else 0
    if own is not None and own.uid == uid and own.round > current:
        return Next("wait", own.round, why="this pod reported in a round not decided yet")
    if decision is not None and decision.member(rank) == pod_digest(uid) \
            and decision.decided_at >= fresh_after:
        return Next("join", current, decision, "this pod took part, after the restart")
    return Next("report", current + 1, why="the trainer restarted inside its pod")


@dataclass(frozen=True)
class Opened:
    """A round some rank opened: participants that are not restoring (running
    agents) report for it; the rank that opened it decides."""

    round: int
    by: str
    at: float

    def to_json(self) -> str:
        return json.dumps({"round": self.round, "by": self.by, "at": round(self.at, 3)},
                          sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: object) -> Opened | None:
        doc = _doc(text)
        try:
            return None if doc is None else cls(_whole(doc["round"]), str(doc["by"]),
                                                  float(doc["at"]))
        except (KeyError, TypeError, ValueError):
            return None


def gettable(report: Report, complete: Iterable[int]) -> dict[int, str | None]:
    """The steps `report`'s rank can get: step -> the timeline of its node's copy
    (None when it would come from a peer or the global tier)."""
    found: dict[int, str | None] = {s: None for s in report.peer}
    found.update({s: None for s in complete})
    for step, timeline in report.local.items():
        if step not in found:
            found[step] = timeline
    return found


def agreed_step(reports: Mapping[int, Report], writers: int) -> int | None:
    """The newest step every rank 0..writers-1 can get, None when there is none
    (or a rank did not report). A step only nodes hold counts when every rank
    that takes it from its own node has a copy of one (non-empty) timeline."""
    if any(r not in reports for r in range(writers)):
        return None
    complete = set().union(*(set(reports[r].complete) for r in range(writers)))
    each = [gettable(reports[r], complete) for r in range(writers)]
    candidates = set().union(*each)
    pins = pinned(reports)
    if pins is not None:
        candidates &= pins
    for step in sorted(candidates, reverse=True):
        if not all(step in g for g in each):
            continue
        if step in complete:
            return step
        timelines = {g[step] for g in each if g[step] is not None}
        if len(timelines) <= 1 and "" not in timelines:
            return step
    return None


def pinned(reports: Mapping[int, Report]) -> set[int] | None:
    """The steps running ranks sit at (None: no rank is pinned). More than
    one means nothing can be agreed until they restart."""
    pins = {rep.pinned for rep in reports.values() if rep.pinned is not None}
    return pins or None


def decide(reports: Mapping[int, Report], writers: int, round_: int, now: float,
           timeline: str) -> Decision | None:
    """The agreed decision once every rank reported in `round_`, else None.
    Also None when a running rank sits at a step some rank cannot get: the
    round stays undecided (its restoring ranks fail and are retried) until
    the running ranks restart too."""
    counted = {r: rep for r, rep in reports.items() if rep.round == round_}
    if any(r not in counted for r in range(writers)):
        return None
    step = agreed_step(counted, writers)
    if step is None and pinned(counted) is not None:
        return None
    local = step is not None and step not in set().union(
        *(set(counted[r].complete) for r in range(writers)))
    detail = (f"every rank reported; step {step} is the newest every rank can get"
              + (" (from the nodes and peers: newer than any global step)" if local else "")
              if step is not None else "every rank reported; no step every rank can get")
    return Decision(round_, step, "agreed", detail,
                    {r: pod_digest(counted[r].uid) for r in range(writers)}, now, timeline)


def fallback(reports: Mapping[int, Report], writers: int, round_: int, now: float,
             uncoordinated: Iterable[int], waited_s: float, timeline: str) -> Decision:
    """The decision when the wait ran out: the plan without coordination, the
    newest step every writer can get by what all of them see alike (complete
    in the global tier, or made whole by the peer tier's holders:
    `uncoordinated`, as the decider sees it)."""
    counted = {r: rep for r, rep in reports.items() if rep.round == round_ and r < writers}
    seen = set(uncoordinated).union(*(set(rep.complete) for rep in counted.values()))
    missing = [r for r in range(writers) if r not in counted]
    step = max(seen) if seen else None
    detail = (f"{_ranks(missing)} did not report within {waited_s:.0f}s; "
              + (f"step {step} is the newest every writer can get without coordinating "
                 "(complete in the global tier, or whole on the peers)" if step is not None
                 else "nothing is complete in the global tier: fresh start"))
    return Decision(round_, step, "fallback", detail,
                    {r: pod_digest(rep.uid) for r, rep in counted.items()}, now, timeline)


def held_back(previous: Decision | None, mine: Report, now: float,
              join_window: float = JOIN_WINDOW_S) -> tuple[bool, int | None] | None:
    """What a fall-back must keep to when the round it replaces was decided
    within the join window: the ranks that took part in that one may be
    running on its step, so the fall-back may only be that step. None when
    there is no such round (or it was a fresh start: never forced on a
    rank that could restore); (True, step) when this rank can get the step,
    (False, step) when it cannot (then nothing may be settled)."""
    if previous is None or previous.step is None \
            or not 0 <= now - previous.decided_at <= join_window:
        return None
    return previous.step in gettable(mine, mine.complete), previous.step


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8]) + (" ..." if len(ranks) > 8 else "")
    return f"rank{'s' if len(ranks) != 1 else ''} {shown}"


def _newest(local: Mapping[int, str]) -> list[tuple[int, str]]:
    return sorted(local.items(), reverse=True)[:REPORT_STEPS]


def pod_digest(uid: str) -> str:
    """A pod uid as a decision records it: 8 hex digits (one rank's pods never
    collide in practice), so a decision for 5,000 ranks stays small."""
    return hashlib.sha256(uid.encode()).hexdigest()[:8]


def _doc(text: object) -> dict[str, Any] | None:
    return parse_object(text, max_chars=192 * 1024) if isinstance(text, str) else None


def _whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 10**18:
        raise ValueError(f"not a whole number: {value!r:.40}")
    return value
