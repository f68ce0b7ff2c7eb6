"""Where a policy's checkpoints were before its store moved, as both sides
speak of it. Pure.

The operator keeps the earlier prefixes in the policy's status
(operator/policy/history.py); the webhook hands them to restore as
`CKPTDRAIN_EARLIER_STORES`, a JSON list, newest first:

    [{"uri": "s3://old/ml/llama", "step": 4200,
      "movedAt": "2026-11-29T10:00:00Z", "reason": "bucket migration"}]

Restore, finding nothing at the current prefix, refuses to call that a fresh
start while this list names a place checkpoints reached (restore/engine.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from ckptdrain.errors import InvalidInput

#: How many earlier prefixes a policy remembers and a pod is told.
MAX_EARLIER = 5
#: The longest text restore reads: five entries are a few KiB (the operator
#: bounds each uri and reason); anything longer is not the operator's list.
MAX_CHARS = 64 * 1024
_EXPECTED = ('a JSON list of at most 5 {"uri": text, "step": whole number >= 0, '
             '"movedAt": text, "reason": text}')


@dataclass(frozen=True)
class EarlierStore:
    #: The full prefix the checkpoints were under (`<storage.uri>/<ns>/<policy>`).
    uri: str
    #: The newest step complete there when the policy moved on.
    step: int
    #: When the operator saw the move (RFC 3339).
    moved_at: str
    #: spec.relocation.reason at the move ("" when none was given).
    reason: str = ""


def encode(stores: Sequence[EarlierStore]) -> str:
    """The environment variable's value for `stores` (newest first)."""
    return json.dumps([{"uri": s.uri, "step": s.step, "movedAt": s.moved_at,
                        "reason": s.reason} for s in stores[:MAX_EARLIER]],
                      separators=(",", ":"))


def _shown(text: str) -> str:
    """The start of a text that could not be read, short enough for one line."""
    return text if len(text) <= 200 else text[:200] + "..."


def _entry(field: str, item: object) -> EarlierStore:
    if not isinstance(item, dict):
        raise InvalidInput(field, _EXPECTED, item)
    uri, step = item.get("uri"), item.get("step")
    moved_at, reason = item.get("movedAt", ""), item.get("reason", "")
    if not isinstance(uri, str) or not uri or type(step) is not int or step < 0 \
            or not isinstance(moved_at, str) or not isinstance(reason, str):
        raise InvalidInput(field, _EXPECTED, item)
    return EarlierStore(uri, step, moved_at, reason)


def parse(field: str, value: object) -> tuple[EarlierStore, ...]:
    """The stores a `CKPTDRAIN_EARLIER_STORES` text names; () for an empty
    text. Anything else raises InvalidInput naming `field`: a list restore
    cannot read must stop it, never let it start fresh."""
    text = str(value).strip()
    if not text:
        return ()
    if len(text) > MAX_CHARS:
        raise InvalidInput(field, f"{_EXPECTED}, at most {MAX_CHARS // 1024} KiB",
                           f"{len(text)} characters")
    try:
        items = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested too deep to read
        raise InvalidInput(field, _EXPECTED, _shown(text)) from None
    if not isinstance(items, list) or len(items) > MAX_EARLIER:
        raise InvalidInput(field, _EXPECTED, _shown(text))
    return tuple(_entry(field, item) for item in items)
