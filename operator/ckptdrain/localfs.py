"""The local filesystem rules every side shares: which files a checkpoint
directory holds, writing bytes at an offset whole, and making a directory
entry durable.

`regular_files` is the one walker behind `push` (transfer/scan.py), the
agent's capture and the local tier's verification (node/durable.py). It
never follows a symlink, the directory itself included: a checkpoint is
plain files, and a link could point anywhere (a key, another job's data).
Anything else (a symlink, a device, a socket, a FIFO, a missing or vanished
directory) raises `UnsafeSource`, so nothing is ever published from it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ckptdrain import paths
from ckptdrain.errors import UnsafeSource

_EXPECTED_FILE = "a regular file or directory (symlinks, devices, sockets and FIFOs are refused)"
_EXPECTED_ROOT = "an existing directory (not a symlink)"


def _kind(mode: int) -> str:
    return "a symlink" if stat.S_ISLNK(mode) else f"a special file (mode {mode:o})"


def regular_files(root: Path) -> list[tuple[str, Path]]:
    """(relative '/'-path, full path) of every regular file under `root`, sorted by path.

    Raises UnsafeSource for a missing, vanished or symlinked `root`, and for
    any entry below it that is neither a directory nor a regular file; and
    UnsafePath for a name a manifest cannot carry (e.g. a backslash).
    """
    root = Path(root)
    try:
        mode = os.lstat(root).st_mode
    except FileNotFoundError:
        raise UnsafeSource("source", _EXPECTED_ROOT, f"{root} (missing)") from None
    if not stat.S_ISDIR(mode):
        seen = _kind(mode) if not stat.S_ISREG(mode) else "a regular file"
        raise UnsafeSource("source", _EXPECTED_ROOT, f"{root} ({seen})")
    found: list[tuple[str, Path]] = []
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        try:
            with os.scandir(root / rel_dir if rel_dir else root) as entries:
                listed = [(e.name, e.path, e.stat(follow_symlinks=False).st_mode)
                          for e in entries]
        except FileNotFoundError as err:
            # The trainer (or a cleanup) removed it while we looked: never
            # mistake that for an empty, complete checkpoint.
            raise UnsafeSource("source", _EXPECTED_ROOT,
                               f"{err.filename or root} (vanished)") from None
        for name, full, mode in listed:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if stat.S_ISDIR(mode):
                pending.append(rel)
            elif stat.S_ISREG(mode):
                found.append((paths.check_relative_path(rel), Path(full)))
            else:
                raise UnsafeSource(f"source file {full}", _EXPECTED_FILE, _kind(mode))
    found.sort()
    return found


def fsync_dir(path: Path) -> None:
    """Make `path`'s entries (a rename into it, a new or removed file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of `data` into file `fd` at `offset` (pwrite may write less)."""
    view, done = memoryview(data), 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
