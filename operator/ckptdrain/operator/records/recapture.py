"""When training was last at a checkpoint's step. Pure.

A record is made when the first writer reports the step, and kept: after a
restart restores an older step and training goes on, the job reaches the
step again and its writers report it again into the same record, whose
creation is then the failed run's. What reads the step's time (the recency
a workload carries, operator/recency/document.py) wants the run that holds
the step now: the work redone after a loss is counted from it.

A writer's claim going back is not enough: within one run an agent steps
back from Draining to Local when a drain is paused or superseded, and
re-claims Local when its partner confirms a copy. Dating the step by such a
pause would understate the work at risk. A writer starts the step over only
on evidence of a new capture:

- it claims `Capturing` where the record holds it past Capturing (`Local`,
  `Draining`, `Retrying`, `Global`, `Failed`): the agent reports Capturing
  once, when a capture begins;
- it claims `Local` where the record holds it `Global`: a committed step is
  never drained again, so only a new capture makes it Local.

The fold then writes

    status.capturedTime   when the step's newest run captured it: the
                          earliest claim of the writers that started it over
                          (never before the record's creation)
    status.recaptured     those writers (rank ranges)

Another writer starting over later in the same run (writers capture a step
within moments of each other, and their reports arrive one by one) keeps
the time and joins `recaptured`; a writer already there starting over
again means yet another run, which starts the account afresh. Without
`capturedTime` the record's creation is when the step was captured.

Missed, since a claim carries no identity of the capture it reports: a
restart whose Capturing claim the operator never saw (the agent's progress
is written every moment or so, and a capture that completes in between
shows as Local over Local, Draining or Failed) keeps the older time, which
overstates the work at risk (the safe side); and a writer counted in one
run whose next run's report comes before the others' is merged into the
run already recorded.

The claims come from pods: a time in the future is taken as now, so the
work at risk is never negative.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ckptdrain.contract.api import parse_timestamp, timestamp
from ckptdrain.contract.progress import Claim
from ckptdrain.contract.share import decode_ranks
from ckptdrain.errors import InvalidInput

#: How far a writer's shard of a step got, for the states a step passes
#: through in one run (Failed and Expired are not on the way).
PROGRESS_ORDER = {"Capturing": 0, "Local": 1, "Draining": 2, "Retrying": 2, "Global": 3}

#: The most rank ranges read from `status.recaptured` (a hand edit can hold any).
MAX_SPANS = 100_000

#: The longest `status.recaptured` the CRD accepts (crds/checkpoints.yaml).
MAX_RECAPTURED = 65536

Spans = list[tuple[int, int]]


def started_over(recorded: Mapping[int, str], claims: Mapping[int, Claim]) -> dict[int, Claim]:
    """The claims of writers that captured the step again: evidence of a
    new capture, not merely a step back (see the module's docstring)."""
    return {rank: claim for rank, claim in claims.items()
            if _new_capture(recorded.get(rank), claim.state)}


def _new_capture(recorded: str | None, claimed: str) -> bool:
    if claimed == "Capturing":
        return recorded is not None and recorded != "Capturing"
    return claimed == "Local" and recorded == "Global"


def recapture(status: Mapping[str, Any], recorded: Mapping[int, str],
              claims: Mapping[int, Claim], now: datetime, writers: int,
              created: object = None) -> dict[str, Any]:
    """The status fields that date the step's newest run, given what the
    record holds per writer (`recorded`), the writers' new claims, how many
    writers the record has and its creation; {} when no writer started the
    step over."""
    over = {r: c for r, c in started_over(recorded, claims).items() if 0 <= r < writers}
    if not over:
        return {}
    first = min(_claimed_at(claim, now) for claim in over.values())
    made = _parsed(created)
    if made is not None and made <= now:
        first = max(first, made)  # a pod clock behind the apiserver's
    current = _parsed(status.get("capturedTime"))
    spans = _spans(status.get("recaptured"), writers)
    same_run = current is not None and bool(spans) and not any(
        _within(spans, rank) for rank in over)
    if same_run:
        return {"capturedTime": timestamp(min(current, first)),
                "recaptured": _encoded(_joined(spans, sorted(over)))}
    return {"capturedTime": timestamp(first),
            "recaptured": _encoded(_joined([], sorted(over)))}


def _claimed_at(claim: Claim, now: datetime) -> datetime:
    when = _parsed(claim.at)
    return now if when is None or when > now else when


def _parsed(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return parse_timestamp(text)
    except ValueError:
        return None


def _spans(text: object, writers: int) -> Spans:
    """The rank ranges in `status.recaptured`, sorted, merged and cut to the
    record's writers, never expanded (a hand edit may name ranks by the
    trillion); none when it is unreadable."""
    try:
        raw = decode_ranks(str(text or ""), "status.recaptured")[:MAX_SPANS]
    except InvalidInput:
        return []
    cut = sorted((low, min(high, writers - 1)) for low, high in raw if low < writers)
    merged: Spans = []
    for low, high in cut:
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def _within(spans: Spans, rank: int) -> bool:
    at = bisect_right(spans, (rank, float("inf"))) - 1
    return at >= 0 and spans[at][0] <= rank <= spans[at][1]


def _joined(spans: Spans, ranks: list[int]) -> Spans:
    """`spans` (merged, sorted) with `ranks` (sorted) added, as merged spans."""
    out: Spans = []
    for low, high in sorted([*spans, *((r, r) for r in ranks)]):
        if out and low <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return out


def _encoded(spans: Spans) -> str:
    """The ranges as text, within the CRD's maxLength: the ranges left out
    are writers that, starting over again, join the run recorded instead of
    starting a newer one, which keeps the older time (the safe side)."""
    parts = [str(low) if low == high else f"{low}-{high}" for low, high in spans]
    text = ",".join(parts)
    while len(text) > MAX_RECAPTURED:
        parts = parts[:len(parts) // 2]
        text = ",".join(parts)
    return text
