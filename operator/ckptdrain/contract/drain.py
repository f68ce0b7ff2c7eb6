"""The drain's settings both sides read: the policy's `drain` section. Pure.

`drain.stallTimeout`: how long a drain may go without progress (no byte
sent, no part durable) before that attempt is failed and retried
(transfer/stall.py). The operator validates it, the agent obeys it.
"""

from __future__ import annotations

from ckptdrain import units
from ckptdrain.errors import InvalidInput

#: Far above the time one part takes at any sensible share, far below a
#: checkpoint interval.
DEFAULT_STALL_AFTER = 300.0
#: Below this one slow request (the S3 client waits up to 60 s for an
#: answer, retries included longer) would fail drains that are healthy.
MIN_STALL_AFTER = 10.0


def parse_stall_timeout(field: str, value: object) -> float:
    """Seconds of drain.stallTimeout; InvalidInput naming `field` when it is
    not a duration of at least MIN_STALL_AFTER."""
    seconds = units.parse_duration(field, value)
    if seconds < MIN_STALL_AFTER:
        raise InvalidInput(field, f"a duration of at least {MIN_STALL_AFTER:g}s, e.g. 5m", value)
    return seconds
