"""The pod's own work dir on the node, as restore makes it for the trainer.

Under a disk local tier the trainer mounts `<volume>/work-<writer>-<pod uid>`
with `subPathExpr` (admission/work_dir.py). kubelet makes that mount when the
trainer starts, and a missing directory it makes itself, as root: a trainer
that is not root could not write it. Restore is an init container, so it
runs before any main container starts, as uid 65532 and with the pod's
fsGroup as a supplementary group. It makes the directory first (`make`):

- inside the volume root it already opened, never through a symlink: a
  symlink, or anything not a directory, under that name is refused;
- a directory this container's uid does not own is refused too (made by
  someone else: kubelet, when something started the trainer before restore);
- its group becomes the pod's (CKPTDRAIN_WORK_GROUP), its mode 2775
  (setgid: what the trainer and the agent create inside stays in the
  group), both set by descriptor and checked;
- an existing one of its own (a restore run again after the pod's sandbox
  restarted, or the hostPath mode's prepare container made it) is kept.

`is_pod_dir` says when the work dir is such a directory: named like one and
at the local tier's volume root (`local_dir` itself with one writer, its
parent with several).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from pathlib import Path

from ckptdrain.errors import CkptdrainError

#: A pod's work dir: the webhook's rank, then the pod's UID.
WORK_NAME = re.compile(r"work-([0-9]+)-([0-9a-f][0-9a-f-]*)")
MODE = 0o2775


class ForeignWorkDir(CkptdrainError):
    """What stands at the pod's work dir is not a directory restore may hand
    to the trainer."""


def is_pod_dir(work_dir: Path, local_dir: Path) -> bool:
    """Whether `work_dir` is a pod's own work dir in the local tier's volume."""
    work, local = Path(os.path.abspath(work_dir)), Path(os.path.abspath(local_dir))
    return WORK_NAME.fullmatch(work.name) is not None and work.parent in (local, local.parent)


def make(work_dir: Path, group: int | None) -> None:
    """Make (or keep) the pod's work dir `work_dir`: owned by this process's
    uid, group `group` (None: the one it inherits), mode 2775. Raises
    ForeignWorkDir naming the path and what stands there."""
    os.close(make_open(work_dir, group))


def make_open(work_dir: Path, group: int | None) -> int:
    """`make`, and a descriptor of the directory it checked (the caller
    closes it): what restore empties, whatever stands at the path later."""
    work = Path(os.path.abspath(work_dir))
    parent = os.open(work.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        # mkdir never follows a symlink at the last component: EEXIST
        with contextlib.suppress(FileExistsError):
            os.mkdir(work.name, MODE, dir_fd=parent)
        fd = _open_dir(work, parent)
    finally:
        os.close(parent)
    try:
        _own(work, fd, group)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_unmoved(work_dir: Path, fd: int) -> None:
    """Raise ForeignWorkDir unless `work_dir` still names the directory `fd`
    holds (not a symlink, nor another dir swapped in at its name)."""
    held = os.fstat(fd)
    try:
        found = os.lstat(work_dir)
    except FileNotFoundError:
        found = None
    if found is None or (found.st_dev, found.st_ino) != (held.st_dev, held.st_ino):
        raise ForeignWorkDir(f"the pod's work dir {work_dir} was replaced after restore made "
                             "it (something else stands at its name now); refusing to hand "
                             "it to the trainer")


def _open_dir(work: Path, parent: int) -> int:
    try:
        return os.open(work.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                       dir_fd=parent)
    except OSError as err:
        # With O_DIRECTORY, Linux answers ENOTDIR for a symlink (O_NOFOLLOW:
        # not followed) as for a file; lstat at the name tells which it is.
        if err.errno == errno.ENOTDIR:
            found = os.stat(work.name, dir_fd=parent, follow_symlinks=False)
            what = "a symlink" if stat.S_ISLNK(found.st_mode) else "not a directory"
            raise ForeignWorkDir(f"the pod's work dir {work} is {what}; refusing to hand it to "
                                 "the trainer (only restore makes it, as a directory)") from err
        raise


def _own(work: Path, fd: int, group: int | None) -> None:
    found = os.fstat(fd)
    if found.st_uid != os.geteuid():
        raise ForeignWorkDir(
            f"the pod's work dir {work} is owned by uid {found.st_uid}, not this container's "
            f"uid {os.geteuid()}: someone else made it (kubelet makes a missing subPath as "
            "root when the trainer starts before restore); refusing to hand it to the trainer")
    if group is not None and found.st_gid != group:
        try:
            os.fchown(fd, -1, group)
        except PermissionError as err:
            raise ForeignWorkDir(
                f"cannot give the pod's work dir {work} the group {group} "
                f"(CKPTDRAIN_WORK_GROUP, the pod's fsGroup): this container is not in it "
                f"(its groups: {sorted(os.getgroups())})") from err
    os.fchmod(fd, MODE)
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    if mode != MODE:  # the kernel drops setgid for a group the caller is not in
        raise ForeignWorkDir(f"the pod's work dir {work}: mode {mode:#o}, expected {MODE:#o} "
                             f"(is this container in the group {os.fstat(fd).st_gid}?)")
