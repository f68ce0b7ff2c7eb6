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
from ckptdrain.errors import UnsafePath, UnsafeSource

_EXPECTED_FILE = "a regular file or directory (symlinks, devices, sockets and FIFOs are refused)"
_EXPECTED_ROOT = "an existing directory (not a symlink)"


_EXPECTED_NAME = "a file name a checkpoint can carry (UTF-8, no control characters or backslash)"
_SPECIAL = ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a special file (a FIFO)"),
            (stat.S_ISSOCK, "a special file (a socket)"),
            (stat.S_ISCHR, "a special file (a character device)"),
            (stat.S_ISBLK, "a special file (a block device)"))


def _kind(mode: int) -> str:
    return next((what for test, what in _SPECIAL if test(mode)), "a special file")


def shown(path: str | os.PathLike[str]) -> str:
    """A path as a person can read it in a message: bytes that are not UTF-8
    as \\xNN, control characters escaped, never a lone surrogate."""
    raw = os.fsencode(path).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in raw)


def _carried(rel: str, full: str) -> str:
    """`rel` when a manifest can carry it as a path, else UnsafeSource naming
    the file: a name the trainer chose is bad input, not a corrupt checkpoint."""
    why = None
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        why = "a name that is not UTF-8"
    else:
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in rel):
            why = "a control character (newline, tab...)"  # S3 listings (XML 1.0) cannot carry
        else:
            try:
                paths.check_relative_path(rel)
            except UnsafePath as err:
                why = "a name that " + str(err).split(": ", 1)[0].removeprefix("manifest path ")
    if why is not None:
        raise UnsafeSource(f"source file {shown(full)}", _EXPECTED_NAME, why)
    return rel


def regular_files(root: Path) -> list[tuple[str, Path]]:
    """(relative '/'-path, full path) of every regular file under `root`, sorted by path.

    Raises UnsafeSource for a missing, vanished or symlinked `root`, and for
    any entry below it that is neither a directory nor a regular file, or
    whose name a manifest cannot carry (not UTF-8, a newline, a backslash).
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
                found.append((_carried(rel, full), Path(full)))
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
