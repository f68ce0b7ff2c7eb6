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
    "caps.cluster": "--cluster-cap",
}


def step_number(field: str, value: str) -> int:
    if not re.fullmatch(r"[0-9]{1,18}", value.strip()):
        raise InvalidInput(field, "a step number: a whole number >= 0", value)
    return int(value)


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
