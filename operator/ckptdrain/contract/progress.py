"""A writer's progress: where each agent says how far its shard of each recent
step got, on its own pod (annotation `ckptdrain.io/progress`). Pure.

Why on the pod: it is the one object that is naturally O(1) per writer and
that the agent writes anyway (its pending bytes, its goodput). One patch per
drain start and one per drain end carries pending bytes and progress
together, so a checkpoint costs a writer two writes, whatever the job's size,
and no two writers ever write the same object. The operator folds the
writers' progress into the step's Checkpoint record (counts and rank ranges,
contract/record.py), which it alone writes.

The document (JSON, at most MAX_STEPS steps, newest kept):

    {"writer": 3, "writers": 8,
     "steps": {"120": {"state": "Global", "bytes": 1048576, "tiers": ["global", "local"],
                       "at": "2026-11-26T18:00:00Z", "peerHolder": 4, "peerNode": "n-b",
                       "message": "...", "requests": {"put": 12, "bytesUp": 1048576}}}}

Everything the operator reads here comes from a pod and is untrusted:
`parse` checks every field and fails with the field's name.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ckptdrain.contract.api import parse_timestamp, timestamp
from ckptdrain.contract.record import REQUEST_FIELDS, STATES, TIERS, State
from ckptdrain.errors import InvalidInput

ANNOTATION_PROGRESS = "ckptdrain.io/progress"
#: Steps a writer keeps in its document: the one capturing, the one draining,
#: a few behind (a node-loss recovery point counts the newest local copies).
MAX_STEPS = 8
#: Longest failure message kept (the whole story is in the agent's log).
MAX_MESSAGE = 240
#: An annotation longer than this is refused whole (a pod can carry anything).
MAX_DOCUMENT = 16 * 1024
_MAX_STEP = 10**15
#: The largest count or size one writer may report (2 PiB): the record's
#: sums stay within what the apiserver stores (int64; the fold clamps).
MAX_COUNT = 2**51
#: The most writers a policy may have (the record's ranges and the share
#: channel are sized for it).
MAX_WRITERS = 1_000_000


@dataclass(frozen=True)
class Claim:
    """One writer's shard of one step, as far as it got."""

    state: str
    bytes: int = 0
    tiers: tuple[str, ...] = ()
    at: str | None = None
    message: str | None = None
    peer_holder: int | None = None
    peer_node: str | None = None
    requests: Mapping[str, int] = field(default_factory=dict)


def claim_of(state: str, size_bytes: int, tiers: Iterable[str], now: datetime,
             message: str | None = None, peer_holder: int | None = None,
             peer_node: str | None = None,
             requests: Mapping[str, int] | None = None) -> Claim:
    """A claim as the agent makes it (checked like one read back)."""
    return _checked(State(state).value, int(size_bytes), tuple(sorted(set(tiers))),
                    timestamp(now), (message or None) and message[:MAX_MESSAGE],
                    peer_holder, peer_node or None, dict(requests or {}), "claim")


def with_claim(steps: Mapping[int, Claim], step: int, claim: Claim,
               keep: int = MAX_STEPS) -> dict[int, Claim]:
    """`steps` with `step` set to `claim`, only the newest `keep` steps kept."""
    out = dict(steps)
    out[int(step)] = claim
    return {s: out[s] for s in sorted(out, reverse=True)[:keep]}


def encode(writer: int, writers: int, steps: Mapping[int, Claim]) -> str:
    """The annotation's value (compact JSON, steps newest first); `writers`:
    how many writers make this writer's checkpoints complete."""
    doc: dict[str, Any] = {"writer": int(writer), "writers": int(writers), "steps": {}}
    for step in sorted(steps, reverse=True):
        c = steps[step]
        entry: dict[str, Any] = {"state": c.state, "bytes": c.bytes, "tiers": list(c.tiers)}
        if c.at:
            entry["at"] = c.at
        if c.message:
            entry["message"] = c.message
        if c.peer_holder is not None:
            entry["peerHolder"] = c.peer_holder
        if c.peer_node:
            entry["peerNode"] = c.peer_node
        if c.requests:
            entry["requests"] = dict(sorted(c.requests.items()))
        doc["steps"][str(step)] = entry
    return json.dumps(doc, separators=(",", ":"))


@dataclass(frozen=True)
class Progress:
    writer: int
    writers: int
    steps: Mapping[int, Claim]


def parse(text: str, field_name: str = f"metadata.annotations[{ANNOTATION_PROGRESS}]"
          ) -> Progress:
    """The document read back from a pod; InvalidInput naming the field otherwise."""
    if len(text) > MAX_DOCUMENT:
        raise InvalidInput(field_name, f"at most {MAX_DOCUMENT} characters", f"{len(text)}")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as err:  # RecursionError: nested too deep
        raise InvalidInput(field_name, "a JSON object", str(err)) from None
    if not isinstance(doc, dict):
        raise InvalidInput(field_name, "a JSON object", type(doc).__name__)
    writers = doc.get("writers")
    if type(writers) is not int or not 1 <= writers <= MAX_WRITERS:
        raise InvalidInput(f"{field_name}.writers", f"an integer in 1..{MAX_WRITERS}",
                           repr(writers)[:40])
    writer = doc.get("writer")
    if type(writer) is not int or not 0 <= writer < writers:
        raise InvalidInput(f"{field_name}.writer", f"a rank in 0..{writers - 1}",
                           repr(writer)[:40])
    raw = doc.get("steps")
    if not isinstance(raw, dict) or len(raw) > MAX_STEPS:
        raise InvalidInput(f"{field_name}.steps", f"an object of at most {MAX_STEPS} steps",
                           type(raw).__name__ if not isinstance(raw, dict) else str(len(raw)))
    steps: dict[int, Claim] = {}
    for key, entry in raw.items():
        where = f"{field_name}.steps.{key[:20]}"
        if not (key.isascii() and key.isdigit()) or len(key) > 16 or int(key) > _MAX_STEP:
            raise InvalidInput(where, "a step number", key[:20])
        if not isinstance(entry, dict):
            raise InvalidInput(where, "an object", type(entry).__name__)
        steps[int(key)] = _checked(entry.get("state"), entry.get("bytes", 0),
                                   entry.get("tiers", []), entry.get("at"),
                                   entry.get("message"), entry.get("peerHolder"),
                                   entry.get("peerNode"), entry.get("requests", {}), where)
    return Progress(writer, writers, steps)


def _checked(state: Any, size: Any, tiers: Any, at: Any, message: Any, peer_holder: Any,
             peer_node: Any, requests: Any, where: str) -> Claim:
    if state not in STATES or state == State.EXPIRED:
        raise InvalidInput(f"{where}.state", "one of " + ", ".join(
            s for s in STATES if s != State.EXPIRED), repr(state)[:40])
    if type(size) is not int or not 0 <= size <= MAX_COUNT:
        raise InvalidInput(f"{where}.bytes", f"an integer in 0..{MAX_COUNT}", repr(size)[:40])
    if not isinstance(tiers, (list, tuple)) or any(t not in TIERS for t in tiers):
        raise InvalidInput(f"{where}.tiers", "names among " + ", ".join(TIERS),
                           repr(tiers)[:80])
    if at is not None:
        try:
            parse_timestamp(at)
        except (TypeError, ValueError):
            raise InvalidInput(f"{where}.at", "a time like 2026-01-01T00:00:00Z",
                               repr(at)[:40]) from None
    if message is not None and (not isinstance(message, str) or len(message) > MAX_MESSAGE):
        raise InvalidInput(f"{where}.message", f"text of at most {MAX_MESSAGE} characters",
                           repr(message)[:40])
    if peer_holder is not None and (type(peer_holder) is not int
                                    or not 0 <= peer_holder < MAX_WRITERS):
        raise InvalidInput(f"{where}.peerHolder", "a rank (an integer ≥ 0)",
                           repr(peer_holder)[:40])
    if peer_node is not None and (not isinstance(peer_node, str) or len(peer_node) > 253):
        raise InvalidInput(f"{where}.peerNode", "a node name", repr(peer_node)[:40])
    if not isinstance(requests, dict) or set(requests) - REQUEST_FIELDS or any(
            type(v) is not int or not 0 <= v <= MAX_COUNT for v in requests.values()):
        raise InvalidInput(f"{where}.requests",
                           f"counts (integers ≥ 0) among {sorted(REQUEST_FIELDS)}",
                           repr(requests)[:80])
    return Claim(state=state, bytes=size, tiers=tuple(sorted(set(tiers))), at=at,
                 message=message or None, peer_holder=peer_holder, peer_node=peer_node or None,
                 requests=dict(requests))
