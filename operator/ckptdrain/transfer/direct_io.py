"""Restored bytes written to a local disk by direct I/O (O_DIRECT): the
device takes them from the buffer the body was read into.

Written through the page cache, every restored byte is copied once more by
the CPU, and the fsync a restore ends with then waits for the kernel to
write all of it back. Onto this project's test machine's disk, that made a
restore from a loopback MinIO 0.67x as fast as s5cmd (which does not fsync)
at 0.95x its CPU per GB; direct, the bytes are copied once, from the socket
into the buffer (docs/benchmarks.md has the figures). The price: the
restored files are not left in the page cache, so the trainer reads them
from the disk.

Only local block filesystems (LOCAL_DISK) get it. In memory (tmpfs) O_DIRECT
is the same copy under another name; over a network (NFS, CephFS, FUSE) it
turns each write into a round trip with no write-back to batch it; btrfs
writes a checksummed file's direct writes through the page cache anyway.

O_DIRECT wants the file offset, the length and the buffer's address aligned
to the device's logical block size: ALIGN covers every common device (and
is at least a page, so no page is ever written both ways), and
`aligned_buffer` gives page-aligned memory; a part that is not aligned (a
file's tail) goes through the page cache. A filesystem that refuses direct
I/O (EINVAL, EOPNOTSUPP at open or at a write) gets the page cache from
then on, in this process; every other error is the file's, and raised.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import re
import threading
from pathlib import Path
from types import TracebackType

from ckptdrain.localfs import pwrite_all

log = logging.getLogger(__name__)

#: Alignment of direct writes: the largest logical block size in common
#: use, and never less than a page.
ALIGN = max(4096, mmap.PAGESIZE)
#: Local block filesystems, where direct I/O goes from the buffer to the device.
LOCAL_DISK = frozenset({"ext2", "ext3", "ext4", "xfs", "f2fs", "bcachefs"})
MOUNTINFO = Path("/proc/self/mountinfo")
#: What a filesystem answers when it does not do direct I/O.
_REFUSALS = {errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP}

#: Devices (st_dev) whose filesystem refused direct I/O in this process.
_refused: set[int] = set()
_refused_lock = threading.Lock()


def _refuse(device: int, err: OSError) -> None:
    with _refused_lock:
        if device in _refused:
            return
        _refused.add(device)
    # Said once: from here on this filesystem's restores go through the page
    # cache, slower and at more CPU, and nothing else would show why.
    log.warning("direct I/O refused on device %d:%d (%s): writing through the page "
                "cache from now on", os.major(device), os.minor(device), err.strerror)


def refused(device: int) -> bool:
    """Whether the filesystem on `device` refused direct I/O in this process."""
    return device in _refused


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash in a path as \ooo.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def filesystem_of(path: Path, mountinfo: str, device: int | None = None) -> str | None:
    """The type of the filesystem `path` (absolute, symlinks resolved) is on,
    from the text of /proc/self/mountinfo. With `device` (the path's
    st_dev): the last-listed mount of that device, if one is (a later mount
    hides an earlier one); else, or without it, the last-listed of the
    mounts with the longest mount point holding `path`. None when none does."""
    by_device: str | None = None
    best: tuple[int, str] | None = None
    target = str(path)
    for line in mountinfo.splitlines():
        before, sep, after = line.partition(" - ")
        fields, kind = before.split(" "), after.split(" ")[0]
        if not sep or len(fields) < 5 or not kind:
            continue
        if device is not None and fields[2] == f"{os.major(device)}:{os.minor(device)}":
            by_device = kind
        point = _unescape(fields[4])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= best[0]):
            best = (len(point), kind)
    if by_device is not None:
        return by_device
    return None if best is None else best[1]


def worthwhile(directory: Path) -> bool:
    """Whether restoring into `directory` should write by direct I/O: a
    local disk's filesystem that has not refused it in this process."""
    if not hasattr(os, "O_DIRECT"):
        return False
    try:
        real = os.path.realpath(directory)
        device = os.stat(real).st_dev
        text = MOUNTINFO.read_text(errors="surrogateescape")
    except (OSError, ValueError):
        return False
    return not refused(device) and filesystem_of(Path(real), text, device) in LOCAL_DISK


def _address_aligned(data: memoryview) -> bool:
    """Whether `data` starts on an ALIGN boundary in memory. Memory that is
    not (a caller's own buffer) goes through the page cache: not a refusal
    of the filesystem, which would cost every later restore onto it."""
    try:
        address = ctypes.addressof(ctypes.c_char.from_buffer(data))
    except (TypeError, ValueError):  # read-only or empty: not ours to write directly
        return False
    return address % ALIGN == 0


def aligned_buffer(size: int) -> memoryview:
    """`size` bytes of page-aligned memory (an anonymous mapping), reused."""
    return memoryview(mmap.mmap(-1, max(size, 1)))[:size]


class DirectFile:
    """An existing file opened for writes: aligned parts by direct I/O (the
    O_DIRECT descriptor opened at the first), the rest (and everything, once
    its filesystem refused direct I/O) through the page cache. `direct`
    counts the bytes written by direct I/O."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._buffered = os.open(path, os.O_WRONLY)
        try:
            self._device = os.fstat(self._buffered).st_dev
        except BaseException:
            os.close(self._buffered)
            raise
        self._direct: int | None = None
        self.direct = 0

    def _direct_fd(self) -> int | None:
        if self._direct is None and not refused(self._device):
            try:
                self._direct = os.open(self._path, os.O_WRONLY | os.O_DIRECT)
            except OSError as err:
                if err.errno not in _REFUSALS:
                    raise
                _refuse(self._device, err)
        return self._direct

    def write(self, data: memoryview, offset: int) -> None:
        """All of `data` at `offset`; OSError as the file gives it."""
        done = 0
        aligned = 0
        if offset % ALIGN == 0 and _address_aligned(data):
            aligned = len(data) - len(data) % ALIGN
        fd = self._direct_fd() if aligned else None
        while fd is not None and done < aligned and not refused(self._device):
            try:
                n = os.pwrite(fd, data[done:aligned], offset + done)
            except OSError as err:
                if err.errno not in _REFUSALS:
                    raise
                _refuse(self._device, err)
                break
            if n <= 0:
                raise OSError(errno.EIO, f"a direct write at {offset + done} moved nothing")
            done += n
            self.direct += n
            if n % ALIGN:
                break  # what is left is no longer aligned
        pwrite_all(self._buffered, data[done:], offset + done)

    def close(self) -> None:
        try:
            if self._direct is not None:
                os.close(self._direct)
                self._direct = None
        finally:
            os.close(self._buffered)

    def __enter__(self) -> DirectFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
