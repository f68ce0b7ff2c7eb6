"""How much a policy's node data takes, and how much room the disk has.

A policy's usage is what `du` would say of its directory: the blocks its
files take (not their apparent sizes: a sparse file takes less, and what
fills the disk is what counts), each hard-linked file once, and its
inodes. The walk never follows a symbolic link (a tenant can make one in
its data, pointing anywhere on the node) and never crosses into another
filesystem (a mount under the directory is not the policy's disk).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Usage:
    bytes: int
    inodes: int


@dataclass(frozen=True)
class Capacity:
    """The filesystem holding the driver's root, for an unprivileged user
    (the agent writes as 65532: root's reserved blocks are not its to use)."""

    available_bytes: int
    total_bytes: int
    available_inodes: int
    total_inodes: int


def measure(directory: Path) -> Usage:
    """The usage of `directory` and everything under it; entries that vanish
    while walked (the agent prunes steps) are skipped."""
    top = os.lstat(directory)
    seen: set[tuple[int, int]] = set()
    used, inodes = 0, 0
    pending = [directory]
    while pending:
        path = pending.pop()
        try:
            entries = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if info.st_dev != top.st_dev:
                continue  # another filesystem mounted here
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            used += info.st_blocks * 512
            inodes += 1
            if stat.S_ISDIR(info.st_mode):
                pending.append(Path(entry.path))
    return Usage(bytes=used + top.st_blocks * 512, inodes=inodes + 1)


def capacity(path: Path) -> Capacity:
    fs = os.statvfs(path)
    return Capacity(available_bytes=fs.f_bavail * fs.f_frsize,
                    total_bytes=fs.f_blocks * fs.f_frsize,
                    available_inodes=fs.f_favail, total_inodes=fs.f_files)
