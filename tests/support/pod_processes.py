"""The processes of one pod saving through the client, run as real processes
(multiprocessing, spawn) by tests/unit/test_pod_saves.py."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

from ckptdrain.client import Client


def client(work: Path, rank: int, processes: int) -> Client:
    return Client(work, environ={"CKPTDRAIN_LOCAL_RANK": str(rank),
                                 "CKPTDRAIN_LOCAL_PROCESSES": str(processes)})


def save_steps(work: Path, rank: int, processes: int, steps: list[int], hold: Any,
               hold_step: int, results: Any) -> None:
    """Save each step as local rank `rank`; before completing `hold_step`, wait
    for `hold` (an Event) when this is the last rank. Records, per step, the
    published directory's inode if it exists right after this complete."""
    c = client(work, rank, processes)
    rng = random.Random(rank)
    for step in steps:
        d = c.begin(step, save=f"s{step}")
        (d / f"rank{rank}.bin").write_bytes(bytes([rank]) * (1000 + step))
        time.sleep(rng.uniform(0, 0.02))
        if step == hold_step and rank == processes - 1:
            assert hold.wait(30), "the test never released the held rank"
        final = c.complete(step, save=f"s{step}")
        seen = os.stat(final).st_ino if final.exists() else None
        results.put((rank, step, seen, os.getpid()))


def die_mid_save(work: Path, rank: int, processes: int, step: int, save: str,
                 dying: int) -> None:
    """Begin `save` of `step`; rank `dying` writes half its file and exits
    without completing, the others complete."""
    c = client(work, rank, processes)
    d = c.begin(step, save=save)
    (d / f"rank{rank}.bin").write_bytes(b"half" if rank == dying else b"whole")
    if rank == dying:
        os._exit(3)
    c.complete(step, save=save)
