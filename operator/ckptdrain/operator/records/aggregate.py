"""Checkpoint records, the operator's side: the aggregate of the writers' claims,
retention of complete records, and the recovery point. Pure.

The record format is the contract (contract/record.py); each writer's claim
comes from its pod's progress annotation (contract/progress.py), which the
operator folds into the record (`fold`).

Completion trusts the agents' claims: an agent reports `Global` for its shard
only after its manifest is written and verified in the store; the operator
marks the checkpoint Global (complete) when every expected writer has done so.
The operator holds no store credentials, by design.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ckptdrain import retention, units
from ckptdrain.contract.api import parse_timestamp, timestamp
from ckptdrain.contract.progress import Claim
from ckptdrain.contract.record import REQUEST_FIELDS, STATES, TIERS, owner_reference
from ckptdrain.contract.share import decode_ranks, encode_ranks
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.records.recapture import PROGRESS_ORDER, recapture

_RANK = PROGRESS_ORDER


def owner_patch(record: Mapping[str, Any], policy_uid: str | None) -> dict[str, Any] | None:
    """Metadata patch adding the policy as owner (agents don't know its uid); None if set."""
    meta = record.get("metadata", {})
    if not policy_uid or any(r.get("uid") == policy_uid for r in meta.get("ownerReferences")
                             or []):
        return None
    ref = owner_reference(record.get("spec", {}).get("policy", ""), policy_uid)
    return {"metadata": {"ownerReferences": [*(meta.get("ownerReferences") or []), ref]}}


@dataclass(frozen=True)
class Summary:
    state: str
    size_bytes: int
    tiers: str
    writers: str
    complete: bool


#: How many failed writers a record names (their count is in `ranks.Failed`).
MAX_FAILURES = 5


def parse_rank(value: object) -> int | None:
    """A rank (or step) as records and documents spell it: an int ≥ 0 or its
    digits (at most nine); None for anything else."""
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 10:
        return int(value)
    return None


def rank_states(status: Mapping[str, Any]) -> dict[int, str]:
    """Each writer's state as the record knows it: its rank ranges, then the
    per-writer claims of agents from before the progress annotation (which
    the operator folds in, so they migrate as they are touched)."""
    states = _ranged(status)
    for writer, claim in (status.get("writers") or {}).items():
        rank = parse_rank(writer)
        if rank is not None and isinstance(claim, Mapping) and claim.get("state") in STATES:
            states[rank] = str(claim["state"])
    return states


def _ranged(status: Mapping[str, Any]) -> dict[int, str]:
    """The writers' states as the operator last folded them (status.ranks);
    a hand-edited range that does not parse says nothing of its ranks."""
    ranks = status.get("ranks")
    if not isinstance(ranks, Mapping):
        return {}
    return {rank: state for state in STATES if state in ranks
            for rank in _spans(ranks.get(state), f"status.ranks.{state}")}


_MAX_SPANS = 100_000
_MAX_RANKS = 1_000_000


def _state_of(states: Mapping[int, str], expected: int, expired: bool) -> tuple[str, bool]:
    claims = list(states.values())
    done = sum(1 for c in claims if c == "Global")
    complete = done >= expected
    if expired:
        return "Expired", complete
    if any(c == "Failed" for c in claims):
        return "Failed", complete
    if complete:
        return "Global", True
    if any(c == "Retrying" for c in claims):
        return "Retrying", False
    draining = any(_RANK.get(c, 0) >= 2 for c in claims)
    if claims and len(claims) >= expected and all(_RANK.get(c, 0) >= 1 for c in claims):
        return ("Draining" if draining else "Local"), False
    return ("Draining" if draining else "Capturing"), False


def summarize(record: Mapping[str, Any]) -> Summary:
    """The aggregate, from the record alone."""
    spec = record.get("spec", {})
    status = record.get("status") or {}
    expected = int(spec.get("writers", 1))
    states = {r: st for r, st in rank_states(status).items() if r < expected}
    state, complete = _state_of(states, expected, status.get("state") == "Expired")
    if "ranks" in status:
        size = int(status.get("sizeBytes") or 0)
        tiers = {t for t in str(status.get("tiers") or "").split(",") if t in TIERS}
    else:  # only per-writer claims (agents from before the progress annotation)
        claims = [c for c in (status.get("writers") or {}).values() if isinstance(c, Mapping)]
        size = sum(int(c.get("bytes", 0)) for c in claims)
        tiers = {t for c in claims for t in c.get("tiers", []) if t in TIERS}
    tiers = tiers - (set() if complete else {"global"})
    return Summary(state=state, size_bytes=size, tiers=",".join(sorted(tiers)) or "-",
                   writers=f"{len(states)}/{expected}", complete=complete)


#: The largest sum a record stores (the apiserver's integers are int64).
_INT64_MAX = 2**63 - 1


def fold(record: Mapping[str, Any], claims: Mapping[int, Claim], now: datetime
         ) -> dict[str, Any]:
    """Status fields the operator writes, with the writers' `claims` for this
    step (rank → claim, from their pods' progress) folded into what the
    record already holds; {} when nothing changes.

    The record keeps what the writers said in rank ranges per state, so a
    writer whose pod is gone still counts; a writer's newer word replaces its
    older one (a step checkpointed again after a restore from an older one
    starts over for that writer, and the record is complete again only when
    every writer has committed it again; `capturedTime` then dates that run,
    records/recapture.py). Ranks at or beyond `spec.writers` are ignored.
    The size is the sum over the writers in `sized`, each counted once, when
    it first reports bytes past Capturing."""
    spec = record.get("spec", {})
    status = record.get("status") or {}
    expected = int(spec.get("writers", 1))
    migrated = "ranks" not in status
    claimed = (status.get("writers") or {}).items()
    legacy = {r: c for r, c in ((parse_rank(w), c) for w, c in claimed)
              if r is not None and r < expected and isinstance(c, Mapping)}
    sources: dict[int, Claim] = {r: _legacy_claim(c) for r, c in legacy.items()}
    if migrated:
        # Nothing counted yet: the per-writer claims are the only account.
        recorded: dict[int, str] = {}
        sized: set[int] = set()
        size, requests, tiers = 0, {}, set()
    else:
        recorded = {r: st for r, st in _ranged(status).items() if r < expected}
        sized = _spans(status.get("sized"), "status.sized")
        size = int(status.get("sizeBytes") or 0)
        requests = {k: int(v) for k, v in (status.get("requests") or {}).items()
                    if k in REQUEST_FIELDS and isinstance(v, int)}
        tiers = {t for t in str(status.get("tiers") or "").split(",") if t in TIERS}
    sources.update({r: c for r, c in claims.items() if 0 <= r < expected})
    failures = [f for f in (status.get("failures") or []) if isinstance(f, Mapping)]
    states = dict(recorded)
    for rank, claim in sources.items():
        old = states.get(rank)
        states[rank] = claim.state
        if claim.state != "Capturing" and claim.bytes > 0 and rank not in sized:
            sized.add(rank)
            size = min(_INT64_MAX, size + claim.bytes)
        if claim.state == "Global" and old != "Global":
            for k, v in claim.requests.items():
                requests[k] = min(_INT64_MAX, requests.get(k, 0) + int(v))
        if claim.state == "Failed" and old != "Failed" and claim.message \
                and len(failures) < MAX_FAILURES \
                and all(f.get("writer") != rank for f in failures):
            failures.append({"writer": rank, "message": claim.message})
        tiers |= set(claim.tiers)
    # A writer that failed and then committed is no longer a failure.
    failures = [f for f in failures if states.get(f.get("writer", -1)) != "Global"]
    state, complete = _state_of(states, expected, status.get("state") == "Expired")
    shown = tiers - (set() if complete else {"global"})
    by_state: dict[str, list[int]] = {}
    for rank, st in states.items():
        by_state.setdefault(st, []).append(rank)
    ranks = {st: (encode_ranks(by_state[st]) if st in by_state else None) for st in STATES
             if st != "Expired"}
    wanted: dict[str, Any] = {"state": state, "sizeBytes": size,
                              "size": units.format_bytes(size),
                              "tiers": ",".join(sorted(shown)) or "-",
                              "writersReady": f"{len(states)}/{expected}",
                              "ranks": ranks, "sized": encode_ranks(sized)}
    if requests:
        wanted["requests"] = requests
    if failures or status.get("failures"):
        wanted["failures"] = failures or None
    wanted |= recapture(status, recorded, claims, now, expected,
                        (record.get("metadata") or {}).get("creationTimestamp"))
    if complete and not status.get("completionTime"):
        wanted["completionTime"] = timestamp(now)
    elif not complete and status.get("completionTime") and state != "Expired":
        wanted["completionTime"] = None  # a writer started the step over
    current_ranks = status.get("ranks") if isinstance(status.get("ranks"), Mapping) else {}
    changed = {}
    for k, v in wanted.items():
        if k == "ranks":
            if any((current_ranks.get(st) or None) != v[st] for st in v):
                changed[k] = v
        elif status.get(k) != v:
            changed[k] = v
    return changed


def _spans(text: object, field: str) -> set[int]:
    try:
        spans = decode_ranks(str(text or ""), field)
    except InvalidInput:
        return set()
    return {r for low, high in spans[:_MAX_SPANS]
            for r in range(low, min(high, low + _MAX_RANKS) + 1)}


def _legacy_claim(claim: Mapping[str, Any]) -> Claim:
    state = claim.get("state")
    return Claim(state=state if state in STATES and state != "Expired" else "Capturing",
                 bytes=int(claim.get("bytes") or 0) if isinstance(claim.get("bytes"), int)
                 else 0,
                 tiers=tuple(t for t in claim.get("tiers") or () if t in TIERS),
                 message=claim.get("message") if isinstance(claim.get("message"), str)
                 else None,
                 requests={k: v for k, v in (claim.get("requests") or {}).items()
                           if k in REQUEST_FIELDS and isinstance(v, int)})


def aggregate_patch(record: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """Status fields the operator writes from the record alone; {} when nothing changes."""
    return fold(record, {}, now)


#: An unfinished record older than the newest complete one is expired only
#: this long after it was made: until then its writers may still be folding
#: in (a step completes on every writer before a newer one does, but the
#: operator may see the newer record's claims first).
SUPERSEDED_GRACE_S = 3600.0


def to_expire(records: Iterable[Mapping[str, Any]], keep: int,
              now: datetime | None = None,
              grace_s: float = SUPERSEDED_GRACE_S) -> list[str]:
    """Names of records to mark Expired: complete ones beyond the newest `keep`
    (never the newest complete: retention.complete_expired), newest first;
    then, given `now`, every unfinished one (local-only, failed, abandoned)
    older than the newest complete and made over `grace_s` ago, which no
    restore would choose."""
    records = list(records)
    summaries = [(int(r["spec"]["step"]), r["metadata"]["name"], summarize(r).state, r)
                 for r in records]
    complete = {step: name for step, name, state, _ in summaries if state == "Global"}
    out = [complete[step] for step in retention.complete_expired(complete, keep)]
    newest = max(complete, default=None)
    if newest is None or now is None:
        return out
    for step, name, state, r in sorted(summaries, key=lambda t: t[0], reverse=True):
        made = (r.get("metadata") or {}).get("creationTimestamp")
        try:
            age = (now - parse_timestamp(made)).total_seconds() if made else 0.0
        except ValueError:
            age = 0.0
        if step < newest and state not in ("Global", "Expired") and age >= grace_s:
            out.append(name)
    return out


def may_make(step: int, claims: Mapping[int, Claim],
             records: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the operator makes a record for `step`, which has none: yes
    above the newest complete or expired step; at or below it only when a
    writer spoke after that record settled (a fresh start from step 0), not
    for the steps writers still name in their progress whose records
    retention already removed."""
    settled = [(int(r["spec"]["step"]), r) for r in records
               if summarize(r).state in ("Global", "Expired")]
    if not settled:
        return True
    newest, record = max(settled, key=lambda t: t[0])
    if step > newest:
        return True
    status = record.get("status") or {}
    when = status.get("expiredTime") or status.get("completionTime") \
        or (record.get("metadata") or {}).get("creationTimestamp")
    said = max((c.at for c in claims.values() if c.at), default=None)
    return bool(when and said and said > when)


#: A writer's states in which its node's local tier holds its shard of the
#: step (a drain that retries or succeeded leaves the local copy in place).
HELD_LOCALLY = frozenset({"Local", "Draining", "Retrying", "Global"})


def held_by_every_writer(record: Mapping[str, Any]) -> bool:
    """Whether every writer of the step claims it on its node's local tier:
    the step restore agrees on when a restart leaves every node intact."""
    expected = int((record.get("spec") or {}).get("writers", 1))
    states = rank_states(record.get("status") or {})
    return all(states.get(rank) in HELD_LOCALLY for rank in range(expected))


def completions(records: Iterable[Mapping[str, Any]]) -> list[tuple[int, str]]:
    """(step, completionTime) of each record that completed globally, expired
    since or not: where a policy's checkpoints reached (policy/history.py)."""
    out = []
    for r in records:
        step = parse_rank((r.get("spec") or {}).get("step"))
        when = (r.get("status") or {}).get("completionTime")
        if step is not None and isinstance(when, str) \
                and summarize(r).state in ("Global", "Expired"):
            out.append((step, when))
    return out


def latest_steps(records: Iterable[Mapping[str, Any]]
                 ) -> tuple[int | None, int | None, str | None]:
    """(newest step every writer holds locally, newest complete global step,
    its completion time): what a restart restores with every node intact, and
    the fall-back when one is lost without the peer tier."""
    local = glob = None
    when = None
    for r in records:
        s = summarize(r)
        if s.state == "Expired":
            continue
        step = int(r["spec"]["step"])
        if held_by_every_writer(r) and (local is None or step > local):
            local = step
        if s.state == "Global" and (glob is None or step > glob):
            glob, when = step, (r.get("status") or {}).get("completionTime")
    return local, glob, when
