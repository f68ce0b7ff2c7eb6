"""Room on a filesystem: is there space for a copy before we start writing it?

A capture or a restore that cannot fit fails after writing gigabytes (and
then retries and writes them again). Asking first costs a directory walk and
one statvfs. The answer is a lower bound on failure, not a promise of
success: another writer may fill the disk meanwhile, so ENOSPC during the
copy is still handled (`is_no_room`).
"""

from __future__ import annotations

import errno
import os
import stat
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
