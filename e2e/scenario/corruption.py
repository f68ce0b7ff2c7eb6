"""Step 7b's pieces: a step restore would really pick, and its local copy corrupted.

Restore never mixes two runs' shards (operator/ckptdrain/restore/agreement.py,
"Timelines"), and step numbers come back after a restore to an older step, so
a step counts here only when the writers' *current* pods saved it and their
own agents drained it: a record the earlier runs left under the same number
says nothing about this run.

    drained(logs, pods)          steps every pod saved and its agent drained
    timeline(local_root, w, s)   the timeline writer w's local copy of s carries
    settled(logs, pods, epoch)   the clock's newest checkpoint, once drained by
                                 all, with time left before the next one
    trailing(logs, pods, epoch)  how many steps the slowest pod's newest save
                                 trails the clock's newest checkpoint
    flip_one_byte(directory)     one byte flipped in every data file of a step
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

from trainers import Logs
from views import EVERY, STEP_S

#: Where in the checkpoint interval (steps after the last scheduled save) a
#: pod may be deleted: past the newest step's drain (about 50 steps at the
#: share), and far enough from the next save that the SIGTERM lands before it.
LATEST_POSITION = 80


def drained(logs: Logs, pods: Iterable[str]) -> list[int]:
    """Steps every pod's trainer saved and its agent reported on the global tier."""
    steps: set[int] | None = None
    for pod in pods:
        saved = {e["step"] for e in logs.trainer(pod) if e["event"] == "save"}
        glob = {int(e["step"]) for e in logs.agent(pod) if e.get("state") == "Global"}
        steps = (saved & glob) if steps is None else steps & saved & glob
    return sorted(steps or ())


def timeline(local_root: Path, writer: int, step: int) -> str | None:
    """The timeline the agent tagged writer `writer`'s local copy of `step` with."""
    path = local_root / f"writer-{writer}" / f"step-{step}" / "manifest.json"
    if not path.is_file():
        return None
    return (json.loads(path.read_text()).get("extra") or {}).get("timeline")


def settled(logs: Logs, pods: Iterable[str], epoch: float, after: int) -> int | None:
    """The shared clock's newest scheduled checkpoint (newer than `after`),
    once every pod saved and drained it, while the next save is still far."""
    position = (time.time() - epoch) / STEP_S
    newest = int(position) // EVERY * EVERY
    if newest <= after or not 30 <= position - newest <= LATEST_POSITION:
        return None
    return newest if newest in drained(logs, pods) else None


def trailing(logs: Logs, pods: Iterable[str], epoch: float) -> tuple[int, int]:
    """How far the slowest pod is behind the shared clock, and how far it got.

    After a restore to a step far behind the clock, a trainer replays the
    missed steps as fast as it can before it follows the clock again; until
    then it saves steps the clock passed long ago, and no step is `settled`.
    Returns (steps between the clock's newest scheduled checkpoint and the
    slowest pod's newest save, that save's step), 0 steps once every pod saved
    within one interval of the clock."""
    newest = int((time.time() - epoch) / STEP_S) // EVERY * EVERY
    saved = [max((e["step"] for e in logs.trainer(pod) if e["event"] == "save"), default=-1)
             for pod in pods]
    slowest = min(saved, default=-1)
    return max(0, newest - EVERY - slowest), slowest


def flip_one_byte(directory: Path) -> list[str]:
    """Flip the middle byte of every non-empty data file of every step under
    `directory` (manifests intact: restore reads them, and the bytes no longer
    match their crc32c); returns the files, relative to `directory`."""
    flipped = []
    for data in sorted(directory.glob("step-*/data/**/*")):
        if data.is_file() and data.stat().st_size > 0:
            with open(data, "r+b") as f:
                f.seek(data.stat().st_size // 2)
                byte = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([byte[0] ^ 0xFF]))
            flipped.append(str(data.relative_to(directory)))
    return flipped
