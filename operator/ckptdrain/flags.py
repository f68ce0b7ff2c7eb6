"""Values a person types on the command line, checked before anything runs.

Each parser raises InvalidInput naming the flag, so `ckptdrain` answers with
one line and exit 2 (docs/cli.md), never a traceback or a silent default.
"""

from __future__ import annotations

import re

from ckptdrain import units
from ckptdrain.errors import InvalidInput

#: The sizing model names its fields as a policy spec does; here they are flags.
SIZE_FIELD_FLAGS = {
    "parameters": "--parameters", "bytesPerParameter": "--bytes-per-parameter",
    "checkpointBytes": "--checkpoint-bytes", "interval": "--interval", "mtti": "--mtti",
    "overlap": "--overlap", "globalEvery": "--global-every", "drainers": "--drainers",
    "localWriteSeconds": "--local-write-time", "caps.policy": "--cap",
    "caps.cluster": "--cluster-cap", "nodeLossFraction": "--node-loss-fraction",
}


def step_number(field: str, value: str, *, latest: bool = False) -> int:
    """A step: a whole number from 0 to 10^18 - 1 (what a manifest can hold)."""
    if not re.fullmatch(r"[0-9]{1,18}", value.strip()):
        raise InvalidInput(field, "a step number: a whole number from 0 to "
                           "999999999999999999" + (", or 'latest'" if latest else ""), value)
    return int(value)


def _bare(value: object) -> bool:
    return isinstance(value, str) and re.fullmatch(r"\s*[0-9.eE+-]+\s*", value) is not None


def rate(field: str, value: str) -> float:
    """A rate with its unit: `--rate 500` would be 500 bytes a second, which
    nobody means, so the unit is required."""
    expected = "a positive rate with its unit such as 50MB/s or 500MiB/s"
    if _bare(value):
        raise InvalidInput(field, expected, value)
    try:
        return units.parse_rate(field, value)
    except InvalidInput:  # its own words would suggest the bare number refused above
        raise InvalidInput(field, expected, value) from None


def duration(field: str, value: str) -> float:
    """A duration with its unit: is `15` seconds or minutes? Required."""
    expected = "a positive duration with its unit such as 15m, 900s or 1h30m"
    if _bare(value):
        raise InvalidInput(field, expected, value)
    try:
        seconds = units.parse_duration(field, value)
    except InvalidInput:
        raise InvalidInput(field, expected, value) from None
    if seconds > MAX_DURATION_S:
        raise InvalidInput(field, "a duration of at most a year (8760h)", value)
    return seconds


#: Below this a model is a toy: `--parameters 405` means 405B far more often.
MIN_PARAMETERS = 1e6
#: Above this, a typo: a thousand times today's largest models.
MAX_PARAMETERS = 1e15
#: No interval, grace or run time of a checkpointing job is longer than a year.
MAX_DURATION_S = 365 * 86400.0


def parameters(field: str, value: str) -> float:
    count = units.parse_count(field, value)
    if not MIN_PARAMETERS <= count <= MAX_PARAMETERS:
        raise InvalidInput(field, "a model size from 1M to 1000T parameters such as 405B or 70M",
                           value)
    return count


def share(field: str, value: str) -> float:
    """A share from 0 to 1, such as 5% or 0.05 (none at all is a valid answer)."""
    return units.parse_fraction(field, value, allow_zero=True)


def bytes_per_parameter(field: str, value: str) -> float:
    """Checkpoint bytes per parameter: 2 for bf16 weights, 14 or 16 with
    Adam's state; a plain number (no B, M: `14B` is not 14e9 bytes)."""
    expected = "a plain number from 0.5 to 64 such as 14 (bf16 + Adam) or 2 (bf16 weights)"
    if not _bare(value):
        raise InvalidInput(field, expected, value)
    number = units.parse_count(field, value) if value.strip() not in ("0", "") else 0.0
    if not 0.5 <= number <= 64:
        raise InvalidInput(field, expected, value)
    return number


def writer_id(value: str) -> int:
    if not re.fullmatch(r"[0-9]{1,9}", value.strip()):
        raise InvalidInput("--writer", "a writer id: a whole number >= 0", value)
    return int(value)


def positive_bytes(field: str, value: str) -> int:
    size = units.parse_bytes(field, value)
    if size < 1:
        raise InvalidInput(field, "a size of at least 1 byte such as 64MiB", value)
    return size


def attach_negative_values(argv: list[str]) -> list[str]:
    """`--rate -5MB/s` as `--rate=-5MB/s`: argparse reads a value that starts
    with '-' as a flag and says only "expected one argument"; attached, the
    value reaches its parser, which refuses it naming the flag."""
    out: list[str] = []
    for arg in argv:
        if (out and re.fullmatch(r"-[0-9.]\S*", arg) and out[-1].startswith("--")
                and "=" not in out[-1]):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out
