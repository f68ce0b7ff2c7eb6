"""Removing a deleted policy's directory from the driver's trash, so that
nothing outside it can be hit: no link is followed (the tenant may have
made links in its data), and no other filesystem is entered (a mount left
inside the tree, by accident or a crash mid-unpublish, is refused, not
emptied).

The walk is done with directory descriptors (the `*at` calls), each one
opened without following a link and checked to be the directory that was
looked at, so a rename or a link swapped in while it runs is not followed
either. It is iterative: a tenant's deep tree costs descriptors, not the
interpreter's stack.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_from(parent: Path, name: str) -> None:
    """Remove `parent/name` (a file, a link or a tree). `parent` itself must
    be a real directory (a link there raises). Raises OSError when something
    could not be removed; what could be is gone."""
    parent_fd = os.open(parent, _OPEN_DIR)
    try:
        _remove_at(parent_fd, name, os.fstat(parent_fd).st_dev)
    finally:
        os.close(parent_fd)


def _remove_at(parent_fd: int, name: str, device: int) -> None:
    # Each open directory: (its fd, its name, its parent's fd, names left in it).
    stack: list[tuple[int, str, int, Iterator[str]]] = []

    def enter_or_unlink(dir_fd: int, entry: str) -> None:
        found = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISDIR(found.st_mode):
            os.unlink(entry, dir_fd=dir_fd)  # a file, or a link itself
            return
        if found.st_dev != device:
            raise OSError(errno.EXDEV, f"{entry!r} is on another filesystem (a mount); "
                          "not entered, left for a person to unmount")
        fd = os.open(entry, _OPEN_DIR, dir_fd=dir_fd)
        if not os.path.samestat(found, os.fstat(fd)):
            os.close(fd)
            raise OSError(errno.EAGAIN, f"{entry!r} changed while being removed")
        stack.append((fd, entry, dir_fd, iter(os.listdir(fd))))

    try:
        enter_or_unlink(parent_fd, name)
        while stack:
            fd, entry, up, left = stack[-1]
            child = next(left, None)
            if child is not None:
                enter_or_unlink(fd, child)
                continue
            stack.pop()
            os.close(fd)
            os.rmdir(entry, dir_fd=up)
    finally:
        for fd, *_ in stack:
            os.close(fd)
