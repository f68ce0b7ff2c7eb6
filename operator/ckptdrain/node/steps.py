"""Step directory names: `step-<N>`, in the work dir (the trainer protocol,
docs/trainer-protocol.md) and in the local tier (node/localtier.py).

One canonical form, one parser: `step-` and the step in decimal without
leading zeros (`step-7`, never `step-007`). A name that only looks like a
step is not one: it is skipped with a warning, so a capture always copies
exactly the directory its step came from (`step_dir(root, parse(name))`
is that directory again).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "step-"
_CANONICAL = re.compile(r"step-(?P<step>0|[1-9][0-9]{0,17})")
_LOOKS_LIKE = re.compile(r"step-[0-9]+")
#: Names already warned about, so a poll every 0.2 s does not repeat itself.
_warned: set[Path] = set()


def step_name(step: int) -> str:
    return f"{PREFIX}{step}"


def parse_step_name(name: str) -> int | None:
    """The step a canonical `step-<N>` name holds; None for anything else."""
    match = _CANONICAL.fullmatch(name)
    return int(match["step"]) if match else None


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / step_name(step)


def is_writing(directory: Path) -> bool:
    """Is a trainer in the middle of writing a step (a `step-<N>.tmp` exists,
    or `step-<N>.tmp-<save>` from a pod of several processes)?"""
    try:
        return any(name.startswith(PREFIX) and (name.endswith(".tmp") or ".tmp-" in name)
                   for name in os.listdir(directory))
    except FileNotFoundError:
        return False


def completed_steps(directory: Path) -> list[int]:
    """Steps with a `step-<N>` directory under `directory`, newest first.

    This is the trainer completion protocol (docs/trainer-protocol.md): the
    trainer writes `step-<N>.tmp/` and renames it to `step-<N>/` when done, so
    a name that matches exactly is a finished checkpoint. A symlink named
    like a step is listed: capturing it fails loudly (localfs.regular_files
    refuses it), which is what the trainer must hear.
    """
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    steps = []
    for name in names:
        step = parse_step_name(name)
        if step is None:
            if _LOOKS_LIKE.fullmatch(name):
                _warn_misnamed(Path(directory) / name)
            continue
        if (Path(directory) / name).is_dir():
            steps.append(step)
    return sorted(steps, reverse=True)


def _warn_misnamed(path: Path) -> None:
    if path not in _warned:
        _warned.add(path)
        log.warning("ignoring %s: a step directory is named step-<N> without leading zeros"
                    " (e.g. step-7)", path)
