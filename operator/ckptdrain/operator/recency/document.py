"""The recency document a workload carries (annotation
`ckptdrain.io/checkpoint-recency`), from its policy's status and records. Pure.

    {"policy": "llama",
     "pod":  {"step": 1200, "time": "2026-11-29T18:00:00Z"},
     "node": {"step": 1100, "time": "2026-11-29T17:45:00Z"},
     "all":  {"step": 1000, "time": "2026-11-29T17:30:00Z"}}

One entry per failure domain, each the newest step a restart restores after
losing that much, and when training was at that step:
- `pod`: a pod lost, its node intact: `status.lastLocalStep` (every writer
  holds it on its own node), or anything newer that survives more;
- `node`: any single node lost: `status.recoveryPointOnNodeLoss` (peer tier)
  or the newest global step, whichever is newer;
- `all`: every node lost: `status.lastGlobalStep`.
So pod >= node >= all. An entry is absent when no step survives that loss.
A step whose record is not at hand yet shows the larger domain's entry.

A step's time is its Checkpoint record's creation: the operator makes the
record when the first writer reports capturing the step, so it is when the
job was at that step (a global step's completion comes minutes later and
would understate the work lost). A step done again after a restart keeps
the record the failed run made: its `status.capturedTime` (the fold writes
it when writers capture the step again, records/recapture.py) is then when
the job was at the step, and the work since the first run is not at risk.
The work at risk is `now - time`; it is not published, since a number that
moves every second would need a write every second: readers compute it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ckptdrain.contract.api import parse_timestamp

ANNOTATION_RECENCY = "ckptdrain.io/checkpoint-recency"
#: The failure domains, the smallest loss first.
DOMAINS = ("pod", "node", "all")


def step_times(records: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    """Step -> when the job was last at it, for a policy's records: the
    record's capturedTime for a step done again, else its creation (also
    when a hand edit left capturedTime unreadable)."""
    out: dict[int, str] = {}
    for r in records:
        step = (r.get("spec") or {}).get("step")
        again = (r.get("status") or {}).get("capturedTime")
        made = again if _is_time(again) else (r.get("metadata") or {}).get("creationTimestamp")
        if type(step) is int and isinstance(made, str) and made:
            out[step] = made
    return out


def _is_time(text: object) -> bool:
    if not isinstance(text, str):
        return False
    try:
        parse_timestamp(text)
    except ValueError:
        return False
    return True


def _newest(*steps: object) -> int | None:
    found = [s for s in steps if type(s) is int]
    return max(found) if found else None


def surviving_steps(status: Mapping[str, Any]) -> dict[str, int | None]:
    """Domain -> the newest step that survives it (None: none does)."""
    everything = _newest(status.get("lastGlobalStep"))
    node = _newest(status.get("recoveryPointOnNodeLoss"), everything)
    pod = _newest(status.get("lastLocalStep"), node)
    return {"pod": pod, "node": node, "all": everything}


def document(policy: str, status: Mapping[str, Any],
             records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The document for a policy's workloads. A step whose record is not at
    hand yet has no time: the newest global step falls back to
    `status.recoveryPointTime` (a little late but never absent); any other
    domain shows the next larger domain's entry until its own record comes
    (within moments): a step that survives a node loss survives a pod loss,
    so it is true, only older; leaving the domain out would say nothing does."""
    times = step_times(records)
    entries: dict[str, Any] = {}
    larger: dict[str, Any] | None = None
    for domain, step in reversed(surviving_steps(status).items()):
        when = None if step is None else times.get(step)
        if when is None and step is not None and step == status.get("lastGlobalStep"):
            when = status.get("recoveryPointTime")
        entry = {"step": step, "time": when} if isinstance(when, str) and when else larger
        if entry is not None:
            entries[domain] = larger = entry
    return {"policy": policy, **{d: entries[d] for d in DOMAINS if d in entries}}


def encode(doc: Mapping[str, Any]) -> str:
    """The annotation's value: compact JSON, domains in DOMAINS order."""
    ordered = {"policy": doc["policy"], **{d: doc[d] for d in DOMAINS if d in doc}}
    return json.dumps(ordered, separators=(",", ":"))

