"""When training was last at a checkpoint's step. Pure.

A record is made when the first writer reports the step, and kept: after a
restart restores an older step and training goes on, the job reaches the
step again and its writers report it again into the same record, whose
creation is then the failed run's. What reads the step's time (the recency
a workload carries, operator/recency/document.py) wants the run that holds
the step now: the work redone after a loss is counted from it.

A writer starts the step over when its claim goes back: its record says
`Global` (or `Draining`, `Local`), its pod now says an earlier state, since
its agent captured the step again. The fold then writes

    status.capturedTime   when the step's newest run captured it: the
                          earliest claim of the writers that started it over
    status.recaptured     those writers (rank ranges)

Another writer starting over later in the same run (writers capture a step
within moments of each other, and their reports arrive one by one) keeps
the time and joins `recaptured`; a writer already there starting over
again means yet another run, which starts the account afresh. Without
`capturedTime` the record's creation is when the step was captured.

The claims come from pods: a time in the future is taken as now, so the
work at risk is never negative.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ckptdrain.contract.api import parse_timestamp, timestamp
from ckptdrain.contract.progress import Claim
from ckptdrain.contract.share import decode_ranks, encode_ranks
from ckptdrain.errors import InvalidInput

#: How far a writer's shard of a step got, for the states a step passes
#: through in one run (Failed and Expired are not on the way).
PROGRESS_ORDER = {"Capturing": 0, "Local": 1, "Draining": 2, "Retrying": 2, "Global": 3}


def started_over(recorded: Mapping[int, str], claims: Mapping[int, Claim]) -> dict[int, Claim]:
    """The claims of writers whose word for the step went back from what the
    record holds for them: they captured it again."""
    return {rank: claim for rank, claim in claims.items()
            if claim.state in PROGRESS_ORDER and recorded.get(rank) in PROGRESS_ORDER
            and PROGRESS_ORDER[claim.state] < PROGRESS_ORDER[recorded[rank]]}


def recapture(status: Mapping[str, Any], recorded: Mapping[int, str],
              claims: Mapping[int, Claim], now: datetime) -> dict[str, Any]:
    """The status fields that date the step's newest run, given what the
    record holds per writer (`recorded`) and the writers' new claims; {} when
    no writer started the step over."""
    over = started_over(recorded, claims)
    if not over:
        return {}
    first = min(_claimed_at(claim, now) for claim in over.values())
    current = _parsed(status.get("capturedTime"))
    spans = _spans(status.get("recaptured"))
    same_run = current is not None and bool(spans) and not any(
        low <= rank <= high for rank in over for low, high in spans)
    if same_run:
        ranks = [r for low, high in spans for r in range(low, high + 1)] + list(over)
        return {"capturedTime": timestamp(min(current, first)),
                "recaptured": encode_ranks(ranks)}
    return {"capturedTime": timestamp(first), "recaptured": encode_ranks(over)}


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


def _spans(text: object) -> list[tuple[int, int]]:
    """The ranks in `status.recaptured`; none when a hand edit left it unreadable."""
    try:
        return decode_ranks(str(text or ""), "status.recaptured")
    except InvalidInput:
        return []
