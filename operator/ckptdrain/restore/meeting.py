"""Where ranks meet to agree on a restore step: Leases in the training namespace.

The rules are restore/agreement.py; this module makes the calls and runs the
bounded wait. Costs for W ranks: one write per rank (its report), one GET of
the decision per rank per poll, one label-selected list of the reports per
poll on the rank that opened the round (and rank 0), one write for the
decision. Polls are spaced by
max(1 s, W/500 s) with jitter, so a 5,000-rank job asks about 500 times a
second while it waits.

Failures: without rights on leases (403) coordination is off and restore
uses the plan without it (said in the result). An apiserver that does not
answer is asked again until the wait runs out; then the rank falls back like
a rank whose peers did not report (the newest global step): while this rank
could not report, no other rank could agree on a newer one.
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from ckptdrain import kubeclient
from ckptdrain.node.lease import LEASE_API, LEASE_PLURAL
from ckptdrain.restore.agreement import (
    Decision,
    Next,
    Opened,
    Report,
    decide,
    fallback,
    held_back,
    next_move,
    next_move_in_place,
    pinned,
    pod_digest,
)

log = logging.getLogger(__name__)

ANNOTATION_REPORT = "ckptdrain.io/restore-report"
ANNOTATION_DECISION = "ckptdrain.io/restore-decision"
ANNOTATION_OPEN = "ckptdrain.io/restore-open"
LABEL_MEETING = "ckptdrain.io/restore-meeting"


class NoRights(Exception):
    """The agent may not use Leases here: coordination is off."""


class Unsettled(Exception):
    """This pod could not get its round's step and the others did not come
    back within the wait: nothing may be restored (agreement.Next.may_fall_back)."""


def _base(policy: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", policy.lower())[:200].strip("-")


def report_name(policy: str, rank: int) -> str:
    return f"ckptdrain-{_base(policy)}-r{rank}"


def decision_name(policy: str) -> str:
    return f"ckptdrain-{_base(policy)}-restore"


def meeting_label(policy: str) -> str:
    """A label value (at most 63 characters) naming the policy's meeting."""
    base = _base(policy)
    if len(base) <= 63:
        return base
    return base[:54].strip("-") + "-" + hashlib.sha256(base.encode()).hexdigest()[:8]


@dataclass
class Agreed:
    """What the meeting settled for this rank."""

    decision: Decision
    #: "joined" an existing decision, "decided" it, or "adopted" another's.
    how: str
    waited_s: float
    round_why: str


class Meeting:
    """One policy's reports and decision, through the apiserver."""

    def __init__(self, namespace: str, policy: str, api: Any = None) -> None:
        self.api = api if api is not None else kubeclient.node_custom_objects_api()
        # "<namespace>/<name>" or a bare name: the Leases live in the namespace.
        self.namespace, self.policy = namespace, policy.split("/")[-1]
        self.label = meeting_label(self.policy)

    def _call(self, verb: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.api, f"{verb}_namespaced_custom_object")
        try:
            return method(*LEASE_API, self.namespace, LEASE_PLURAL, *args, _request_timeout=5,
                          **kwargs)
        except Exception as error:
            if kubeclient.api_status(error) == 403:
                raise NoRights(f"no rights on leases in {self.namespace}: {error.reason}") \
                    from None
            raise

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self._call("get", name))
        except Exception as error:
            if kubeclient.api_status(error) == 404:
                return None
            raise

    def state(self) -> tuple[Decision | None, Opened | None, dict[str, Any] | None]:
        """The current decision, the open round (if any), and the object they
        were read from (for the compare-and-swap that replaces it)."""
        found = self._get(decision_name(self.policy))
        if found is None:
            return None, None, None
        notes = (found.get("metadata") or {}).get("annotations") or {}
        return (Decision.from_json(notes.get(ANNOTATION_DECISION)),
                Opened.from_json(notes.get(ANNOTATION_OPEN)), found)

    def decision(self) -> tuple[Decision | None, dict[str, Any] | None]:
        current, _, found = self.state()
        return current, found

    def own_report(self, rank: int) -> Report | None:
        found = self._get(report_name(self.policy, rank))
        return None if found is None else _report_of(found, rank)

    def report(self, report: Report, pod: str | None = None) -> None:
        """Write this rank's report (replacing its previous one), owned by its
        pod `pod` (its uid is the report's): deleted with it."""
        name = report_name(self.policy, report.rank)
        meta: dict[str, Any] = {"name": name, "labels": {LABEL_MEETING: self.label},
                                "annotations": {ANNOTATION_REPORT: report.to_json()}}
        if pod:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": pod,
                                        "uid": report.uid}]
        body = {"apiVersion": "/".join(LEASE_API), "kind": "Lease", "metadata": meta,
                "spec": {"holderIdentity": report.uid}}
        for _ in range(3):
            found = self._get(name)
            try:
                if found is None:
                    self._call("create", body)
                else:
                    body["metadata"]["resourceVersion"] = \
                        (found.get("metadata") or {}).get("resourceVersion")
                    self._call("replace", name, body)
                return
            except Exception as error:
                if kubeclient.api_status(error) != 409:
                    raise
        raise RuntimeError(f"report lease {name} kept changing under this rank")

    def reports(self) -> dict[int, Report]:
        """Every rank's report (rank 0 reads them to decide)."""
        found = self._call("list", label_selector=f"{LABEL_MEETING}={self.label}")
        out: dict[int, Report] = {}
        for item in found.get("items") or []:
            name = (item.get("metadata") or {}).get("name", "")
            match = re.fullmatch(re.escape(report_name(self.policy, 0)[:-1]) + r"([0-9]+)", name)
            if match:
                rep = _report_of(item, int(match[1]))
                if rep is not None:
                    out[rep.rank] = rep
        return out

    def _write(self, read: dict[str, Any] | None, decision: Decision | None,
               opened: Opened | None) -> bool:
        """Replace the decision's Lease as read (create it when `read` is None);
        False when another rank changed it first."""
        notes = {}
        if decision is not None:
            notes[ANNOTATION_DECISION] = decision.to_json()
        if opened is not None and (decision is None or opened.round > decision.round):
            notes[ANNOTATION_OPEN] = opened.to_json()
        name = decision_name(self.policy)
        meta: dict[str, Any] = {"name": name, "labels": {LABEL_MEETING: self.label},
                                "annotations": notes}
        body = {"apiVersion": "/".join(LEASE_API), "kind": "Lease", "metadata": meta,
                "spec": {"holderIdentity": decision.timeline if decision else None}}
        try:
            if read is None:
                self._call("create", body)
            else:
                meta["resourceVersion"] = (read.get("metadata") or {}).get("resourceVersion")
                self._call("replace", name, body)
            return True
        except Exception as error:
            if kubeclient.api_status(error) != 409:
                raise
            return False

    def write_decision(self, decision: Decision, read: dict[str, Any] | None) -> Decision:
        """Write `decision` over the one read as `read` (None: there was none);
        when another rank wrote first, its decision is returned instead."""
        opened = None
        if read is not None:
            opened = Opened.from_json(((read.get("metadata") or {}).get("annotations") or {})
                                      .get(ANNOTATION_OPEN))
        if self._write(read, decision, opened):
            return decision
        won, _ = self.decision()
        if won is None:
            raise RuntimeError(f"decision lease {decision_name(self.policy)} changed and then "
                               "could not be read")
        return won

    def open(self, round_: int, uid: str, read: dict[str, Any] | None,
             current: Decision | None, now: float) -> bool:
        """Mark round `round_` open (so running agents report for it); True
        when this write made it so, False when another rank changed the
        Lease first (read it again)."""
        return self._write(read, current, Opened(round_, uid, now))


def _report_of(obj: dict[str, Any], rank: int) -> Report | None:
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_REPORT)
    rep = Report.from_json(text)
    return rep if rep is not None and rep.rank == rank else None


def new_timeline(round_: int) -> str:
    return f"r{round_}-{secrets.token_hex(6)}"


def agree(meeting: Meeting, *, rank: int, uid: str, writers: int, pod: str | None = None,
          report_for: Callable[[int], Report], uncoordinated: Iterable[int], timeout_s: float,
          in_place_after: float | None = None,
          clock: Callable[[], float] = time.time,
          monotonic: Callable[[], float] = time.monotonic,
          sleep: Callable[[float], None] = time.sleep,
          rng: random.Random | None = None) -> Agreed:
    """Join the current decision, or report, open the round, and wait (at
    most `timeout_s`) for its decision: the rank that opened it (and rank 0)
    decides once every rank reported, and any rank writes the fall-back
    decision when the wait runs out. `in_place_after`: this is a trainer
    restarted inside its pod that last saved at that time
    (agreement.next_move_in_place).
    Raises NoRights when leases are not ours to use, Unsettled when this pod
    may not fall back, and the apiserver's error when it could not be asked
    at all by the end of the wait."""
    rng = rng or random.Random()
    started = monotonic()
    poll = max(1.0, writers / 500)
    uncoordinated = list(uncoordinated)
    last_error: Exception | None = None
    read: dict[str, Any] | None = None
    step_round: int | None = None
    #: The decision the round replaces (agreement.held_back).
    previous: Decision | None = None
    nxt = Next("report", 0)
    while True:
        try:
            current, opened, read = meeting.state()
            if step_round is None:
                own = meeting.own_report(rank)
                nxt = (next_move(current, own, rank, uid, clock()) if in_place_after is None
                       else next_move_in_place(current, own, rank, uid, in_place_after))
                if nxt.move == "join" and nxt.decision is not None:
                    joined = nxt.decision
                    if joined.member(rank) != pod_digest(uid):
                        # Recorded, so that this rank's next pod starts a new round.
                        joined = meeting.write_decision(joined.with_member(rank, uid), read)
                        if joined.member(rank) != pod_digest(uid):  # another wrote first
                            sleep(rng.random() * poll)  # joiners spread out, then look again
                            continue
                    return Agreed(joined, "joined", monotonic() - started, nxt.why)
                step_round, previous = nxt.round, current
                if nxt.move == "report":
                    mine = report_for(step_round)
                    if not nxt.may_fall_back and own is not None:
                        # Carried on, so this pod's later tries still never fall back.
                        mine = replace(mine, failed=own.failed, failed_fresh=own.failed_fresh)
                    meeting.report(mine, pod)
            elif current is not None and current.round >= step_round:
                return Agreed(current, "adopted", monotonic() - started, nxt.why)
            if opened is None or opened.round < step_round:
                meeting.open(step_round, uid, read, current, clock())
                continue  # whoever opened it, read the Lease as it is now
            if rank == 0 or (opened.round == step_round and opened.by == uid):
                made = decide(meeting.reports(), writers, step_round, clock(),
                              new_timeline(step_round))
                if made is not None:
                    won = meeting.write_decision(made, read)
                    # By value: a write whose answer was lost is sent again,
                    # refused (409), and read back as this rank wrote it.
                    return Agreed(won, "decided" if won == made else "adopted",
                                  monotonic() - started, nxt.why)
            last_error = None
        except NoRights:
            raise
        except Exception as error:  # the apiserver did not answer: ask again
            last_error = error
            log.warning("restore agreement: the apiserver did not answer: %s", error)
        waited = monotonic() - started
        if waited >= timeout_s:
            break
        sleep(min(poll * (0.5 + rng.random()), max(0.0, timeout_s - waited)))
    waited = monotonic() - started
    if last_error is not None or step_round is None:
        raise last_error or RuntimeError("restore agreement: no round")
    if not nxt.may_fall_back:
        raise Unsettled(f"{nxt.why}, which the other ranks restored; waited {waited:.0f}s in "
                        f"round {step_round} for them to restart and agree again")
    reports = meeting.reports()
    made = fallback(reports, writers, step_round, clock(), uncoordinated, waited,
                    new_timeline(step_round))
    kept = held_back(previous, report_for(step_round), clock())
    if kept is not None:
        can, step = kept
        if not can:
            raise Unsettled(f"the ranks of round {step_round - 1} restored step {step} moments "
                            f"ago and may be running on it; this rank cannot get it, and the "
                            f"others did not come back within {waited:.0f}s")
        made = replace(made, step=step, detail=f"{made.detail.split(';')[0]}; step {step}, "
                       f"which the ranks of round {step_round - 1} restored moments ago")
    pins = pinned({r: rep for r, rep in reports.items() if rep.round == step_round})
    if pins is not None and pins != {made.step}:
        raise Unsettled(f"running rank(s) sit at step(s) {sorted(pins)} and not every rank "
                        f"can get that; waited {waited:.0f}s in round {step_round} for them to "
                        "restart")
    current, _, read = meeting.state()
    if current is not None and current.round >= step_round:
        return Agreed(current, "adopted", waited, nxt.why)
    won = meeting.write_decision(made, read)
    return Agreed(won, "decided" if won == made else "adopted", waited, nxt.why)
