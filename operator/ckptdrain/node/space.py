"""Room on a filesystem: is there space for a copy before we start writing it?

A capture or a restore that cannot fit fails after writing gigabytes (and
then retries and writes them again). Asking first costs a directory walk and
one statvfs. The answer is a lower bound on failure, not a promise of
success: another writer may fill the disk meanwhile, so ENOSPC during the
copy is still handled (`is_no_room`).

For the local tier, `plan_room` decides what may go so that a capture fits
the policy's capacity and the disk, and always leaves room for the SIGTERM
checkpoint (the size of the last step); how many steps' room that is:
contract/tier_reserve.py (policy admission sizes by it too).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ckptdrain import units

#: errnos that say "this filesystem cannot take the bytes", not "the bytes are bad".
NO_ROOM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


class NoRoom(OSError):
    """The destination filesystem has less free space than the copy needs."""

    def __init__(self, where: Path, needed: int, free: int) -> None:
        super().__init__(errno.ENOSPC, f"needs {units.format_bytes(needed)}, "
                         f"{units.format_bytes(free)} free", str(where))
        self.needed = needed
        self.free = free


def is_no_room(err: BaseException) -> bool:
    """Did `err` come from a full, over-quota or read-only destination?"""
    return isinstance(err, OSError) and err.errno in NO_ROOM_ERRNOS


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still put on `path`'s filesystem (the
    nearest existing parent's, when `path` does not exist yet)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize


def tree_bytes(root: Path) -> int:
    """Total size of the regular files under `root` (symlinks not followed; 0 if missing)."""
    total = 0
    for top, _dirs, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(top, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def check_room(where: Path, needed: int) -> None:
    """Raise NoRoom unless `where`'s filesystem has at least `needed` bytes free."""
    free = free_bytes(where)
    if needed > free:
        raise NoRoom(where, needed, free)


class WontFit(OSError):
    """A capture the local tier cannot hold, even after removing what it may.
    An ENOSPC, so callers back off as for a full disk; the text says why."""

    def __init__(self, message: str, where: Path) -> None:
        super().__init__(errno.ENOSPC, message, str(where))
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Room:
    """What `plan_room` decided: steps to remove first (in this order), and
    None or the reason the bytes cannot fit even then (then remove nothing)."""

    evict: tuple[int, ...]
    refused: str | None = None


def plan_room(need: int, reserve: int, sizes: Mapping[int, int], evictable: Sequence[int],
              capacity: int | None, free: int) -> Room:
    """Make `need` bytes fit and leave `reserve` more free, within `capacity`
    (the policy's budget for the tier; None: none) and the disk's `free`
    bytes, by removing `evictable` steps in order, as few as will do. Pure.

    `reserve` is the room the SIGTERM checkpoint needs (and, with the work
    dir on the tier's disk, the trainer's next save: agent/loop.py): a
    scheduled capture leaves it, so the emergency one always finds it."""
    used = sum(sizes.values())
    evict: list[int] = []

    def fits() -> bool:
        within = capacity is None or used + need + reserve <= capacity
        return within and need + reserve <= free

    for step in evictable:
        if fits():
            break
        evict.append(step)
        used -= sizes.get(step, 0)
        free += sizes.get(step, 0)  # the same filesystem: what goes is free again
    if fits():
        return Room(tuple(evict))
    wanted = units.format_bytes(need) + (
        f" plus {units.format_bytes(reserve)} kept free for the SIGTERM checkpoint"
        " (and the trainer's next save when it writes on this disk)"
        if reserve else "")
    budget = (f"the local tier's capacity is {units.format_bytes(capacity)} and "
              f"{units.format_bytes(used)} of it stays in use"
              if capacity is not None else f"{units.format_bytes(used)} stays in use")
    return Room((), f"needs {wanted}; {budget} (steps being drained and the only copy of "
                    f"the recovery point are kept), and the disk would have "
                    f"{units.format_bytes(free)} free")
