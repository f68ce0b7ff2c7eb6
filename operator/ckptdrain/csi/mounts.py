"""The driver's only mount calls: a bind mount, its removal, and whether a
path is a mount point. Linux only, as root (the driver's DaemonSet pod is
privileged, with the kubelet pods dir mounted Bidirectional so that kubelet
and the pod see the mount).

mount(2) through libc rather than the `mount` program: no shell, no parsing
of its messages, nothing to install in the image. A bind mount of a
directory on the same filesystem keeps st_dev, so os.path.ismount cannot see
it; /proc/self/mountinfo can.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import tempfile
from pathlib import Path

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MNT_DETACH = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def _check(rc: int, what: str, path: Path) -> None:
    if rc != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}", str(path))


def remount_flags(read_only: bool) -> int:
    """The flags the bind mount ends with: never set-uid programs or device
    files from the tenant's data (a file a pod wrote must not become a
    setuid binary or a raw disk for another pod), read-only when asked."""
    return MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | (MS_RDONLY if read_only else 0)


def bind(source: Path, target: Path, read_only: bool) -> None:
    """Bind-mount directory `source` at `target`, nosuid and nodev (and
    read-only when asked), in every mount namespace that sees `target`.

    A bind mount ignores such flags on the first call, and a remount changes
    only this namespace's copy: the host's copy (the one kubelet hands the
    pod) would stay rw,suid,dev. So the flags are set on a private staging
    mount first, and the target is a bind of that staging mount: a new bind
    copies its source's flags, and so does every copy propagated from it.
    The staging point sits beside `source`, outside what a pod sees, in the
    driver's own root (its container's filesystem is read-only), mounted
    HostToContainer: a mount made there does not reach the host.
    """
    staging = Path(tempfile.mkdtemp(prefix=".mount-", dir=source.parent))
    try:
        _check(_libc.mount(os.fsencode(source), os.fsencode(staging), None, MS_BIND, None),
               "bind mount", staging)
        try:
            _check(_libc.mount(None, os.fsencode(staging), None, remount_flags(read_only),
                               None), "remount nosuid,nodev", staging)
            _check(_libc.mount(os.fsencode(staging), os.fsencode(target), None, MS_BIND,
                               None), "bind mount", target)
        finally:
            unmount(staging)
    finally:
        os.rmdir(staging)


def unmount(target: Path) -> None:
    """Unmount `target`, lazily: a process still inside it (a pod being torn
    down) must not make kubelet's retry loop spin."""
    _check(_libc.umount2(os.fsencode(target), MNT_DETACH), "unmount", target)


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_points(mountinfo: str) -> set[str]:
    """The mount points listed in a /proc/<pid>/mountinfo text."""
    return {_unescape(line.split()[4]) for line in mountinfo.splitlines() if line.strip()}


def _current_mount_points() -> set[str]:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as info:
        return mount_points(info.read())


def is_mount_point(path: Path) -> bool:
    return str(path) in _current_mount_points()


def mounted_under(directory: Path) -> bool:
    """Whether anything is mounted at or below `directory` (a staging mount
    a crash left, say): such a directory is never deleted."""
    inside = str(directory).rstrip("/") + "/"
    return any(point == str(directory) or point.startswith(inside)
               for point in _current_mount_points())
