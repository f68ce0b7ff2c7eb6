"""Capture by reference: each file of a published step is taken by reflink,
else by hard link, else by copy, and checksummed by reading what was taken.

    reflink  ioctl(FICLONE) on a new file: shares the trainer's blocks copy-on-write
             (XFS with reflink, btrfs, bcachefs); later writes by the trainer
             never reach it. No bytes move.
    link     link(2): the same inode as the trainer's file. No bytes move, but a
             trainer that rewrites the file in place after `complete` would change
             it, so its stat identity is recorded and checked (below).
    copy     durable.copy_file, as before there was a choice: bytes are copied,
             and the source must hold still while they are.

Each falls back to the next on the errors that mean "not here": a filesystem
without reflink (EOPNOTSUPP, EINVAL, ENOTTY, ENOSYS), another filesystem or
mount (EXDEV: link(2) across two mounts fails even on one filesystem),
protected_hardlinks or a link count at its limit (EPERM, EACCES, EMLINK).
Anything else is a real error and stops the capture.

The checksum is computed by reading the taken file once (the trainer has just
written it, so its pages are usually in the page cache) and every taken file is
fsync'd by the caller: the trainer's own bytes may not be durable yet.

A rewrite is never captured unnoticed. For a hard link, the stat identity
(inode, size, mtime, ctime) is taken before and after the checksum read; if it
moved, the trainer was writing: the link is dropped and the file is copied
instead. A copy whose source moves while it is copied is refused
(IntegrityError): the trainer is still writing a step it published. A linked
file's identity is kept beside the step (LINKS, written by the local tier) and
checked again before the step is trusted (Identity.drift); a timestamp moves
only at the kernel clock's tick, so a same-size rewrite inside one tick slips
past the stat check and is caught by the checksum re-reads every reader of the
local tier makes (LocalTier.verify, the drain's part CRCs, restore's copy).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ckptdrain import checksum
from ckptdrain.errors import IntegrityError
from ckptdrain.manifest import FileEntry
from ckptdrain.node import durable

#: linux/fs.h: _IOW(0x94, 9, int), the fd to clone from as its argument.
FICLONE = 0x40049409
REFLINK, LINK, COPY = "reflink", "link", "copy"
#: Bytes per read of a taken file (one buffer per capture thread) and per stop check.
READ_BUFFER = 8 << 20
METHODS = (REFLINK, LINK, COPY)
#: errno values that mean "this method is not available here": try the next one.
_NOT_HERE = frozenset({errno.EXDEV, errno.EPERM, errno.EACCES, errno.EMLINK,
                       errno.EOPNOTSUPP, errno.EINVAL, errno.ENOTTY, errno.ENOSYS})


def ficlone(src_fd: int, dst_fd: int) -> None:
    """Make `dst_fd`'s file share `src_fd`'s blocks (copy-on-write)."""
    fcntl.ioctl(dst_fd, FICLONE, src_fd)


@dataclass(frozen=True)
class Methods:
    """How files are taken; tests inject these to reach each fallback on any filesystem."""
    clone: Callable[[int, int], None] = ficlone
    link: Callable[[Path, Path], None] = os.link


#: Reflink, hard link and copy as the kernel does them.
BY_KERNEL = Methods()


@dataclass(frozen=True)
class Identity:
    """What changes when a file's bytes do (st_ino, st_size, st_mtime_ns, st_ctime_ns)."""
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> Identity:
        return cls(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def drift(self, st: os.stat_result) -> str | None:
        """What differs in `st`, or None. A ctime change alone counts only while
        another name still shares the inode: removing the trainer's name (its
        work-dir prune) moves ctime too, and leaves nobody who could write."""
        now = Identity.of(st)
        moved = [name for name in ("ino", "size", "mtime_ns")
                 if getattr(now, name) != getattr(self, name)]
        if now.ctime_ns != self.ctime_ns and st.st_nlink > 1:
            moved.append("ctime_ns")
        return None if not moved else ", ".join(
            f"{name} {getattr(self, name)} -> {getattr(now, name)}" for name in moved)


@dataclass(frozen=True)
class Taken:
    entry: FileEntry
    method: str
    #: For a hard link: the identity its checksum was read under.
    identity: Identity | None = None


def _crc_read(fd: int, size: int, should_stop: durable.StopCheck | None) -> int | None:
    """CRC32C of the first `size` bytes of `fd`, or None if the file ends early
    (a trainer truncating it). Read, not mapped: a mapped page past a shrunk
    end would kill the process (SIGBUS)."""
    crc, done = 0, 0
    buffer = memoryview(bytearray(min(READ_BUFFER, size)))
    while done < size:
        if should_stop is not None and should_stop():
            raise durable.CopyAborted("capture stopped")
        n = os.preadv(fd, [buffer[: min(len(buffer), size - done)]], done)
        if n == 0:
            return None
        crc = checksum.crc32c(buffer[:n], crc)
        done += n
    return crc


def _reflinked(src: Path, dst: Path, clone: Callable[[int, int], None],
               should_stop: durable.StopCheck | None) -> tuple[int, int] | None:
    """(size, CRC32C) of a clone of `src` at `dst`, or None (nothing left at `dst`)."""
    fin = os.open(src, os.O_RDONLY)
    try:
        fout = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                clone(fin, fout)
            except OSError as err:
                if err.errno not in _NOT_HERE:
                    raise
                os.unlink(dst)
                return None
            size = os.fstat(fout).st_size
            crc = _crc_read(fout, size, should_stop)
            if crc is None:  # a clone is ours alone: it cannot shrink
                raise IntegrityError(f"{dst}: the clone of {src} ends before its size")
            return size, crc
        finally:
            os.close(fout)
    finally:
        os.close(fin)


def _linked(rel: str, src: Path, dst: Path, link: Callable[[Path, Path], None],
            should_stop: durable.StopCheck | None) -> Taken | None:
    """A hard link of `src` at `dst` that held still while it was read, or None
    (nothing left at `dst`) when linking is not available here or the file
    moved during the read: the trainer was writing it, so it is copied instead."""
    try:
        link(src, dst)
    except OSError as err:
        if err.errno not in _NOT_HERE:
            raise
        return None
    fd = os.open(dst, os.O_RDONLY)
    try:
        before = Identity.of(os.fstat(fd))  # after link(2), which itself moves ctime
        crc = _crc_read(fd, before.size, should_stop)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if crc is None or before.drift(after) is not None:
        os.unlink(dst)
        return None
    return Taken(FileEntry(rel, before.size, checksum.to_hex(crc)), LINK, before)


def _copied(src: Path, dst: Path, should_stop: durable.StopCheck | None) -> tuple[int, int]:
    """durable.copy_file, refused if `src` moved while its bytes were copied."""
    before = Identity.of(os.stat(src))
    size, crc = durable.copy_file(src, dst, should_stop=should_stop, sync=False)
    moved = before.drift(os.stat(src))
    if moved is not None:
        raise IntegrityError(f"{src} changed while it was captured ({moved}): the trainer "
                             "is still writing a step it published; nothing captured")
    return size, crc


def take_file(rel: str, src: Path, dst: Path, *, methods: Methods = BY_KERNEL,
              should_stop: durable.StopCheck | None = None) -> Taken:
    """Take `src` as the new file `dst` by the first method that works here (not fsync'd)."""
    got = _reflinked(src, dst, methods.clone, should_stop)
    if got is not None:
        return Taken(FileEntry(rel, got[0], checksum.to_hex(got[1])), REFLINK)
    linked = _linked(rel, src, dst, methods.link, should_stop)
    if linked is not None:
        return linked
    size, crc = _copied(src, dst, should_stop)
    return Taken(FileEntry(rel, size, checksum.to_hex(crc)), COPY)


def take_tree(src: Path, dst: Path, *, methods: Methods = BY_KERNEL,
              should_stop: durable.StopCheck | None = None,
              workers: int = durable.DEFAULT_WORKERS) -> list[Taken]:
    """Take every regular file under `src` into the new directory `dst` (symlinks and
    special files refused, as localfs.regular_files does), sorted by path.

    Every file and directory under `dst` is fsync'd before this returns; on any
    error `dst` is removed (our names only: the trainer's files are untouched)."""
    rels = durable.list_files(src)
    dst.mkdir(parents=True, exist_ok=False)
    try:
        dirs = durable.make_dirs(dst, rels)

        def one(rel: str) -> Taken:
            parts = rel.split("/")
            return take_file(rel, src.joinpath(*parts), dst.joinpath(*parts),
                             methods=methods, should_stop=should_stop)

        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(rels) or 1))) as pool:
            taken = list(pool.map(one, rels))
        durable.sync_tree(dst, rels, dirs)
        return taken
    except BaseException:
        shutil.rmtree(dst, ignore_errors=True)
        raise


def count_methods(taken: list[Taken]) -> dict[str, int]:
    """Files taken per method, every method named (0 when unused)."""
    counts = Counter(t.method for t in taken)
    return {method: counts.get(method, 0) for method in METHODS}


# -- the identities of linked files, kept beside a captured step -------------------
_LINKS_FORMAT = 1


def links_to_json(taken: list[Taken]) -> bytes | None:
    """The identities of the hard-linked files of `taken`, or None when there are none."""
    linked = {t.entry.path: [t.identity.ino, t.identity.size, t.identity.mtime_ns,
                             t.identity.ctime_ns]
              for t in taken if t.identity is not None}
    if not linked:
        return None
    return json.dumps({"format": _LINKS_FORMAT, "files": linked}, sort_keys=True).encode()


def links_from_json(data: bytes, where: Path) -> dict[str, Identity]:
    """Parse what links_to_json wrote; IntegrityError naming `where` if it is not that."""
    try:
        doc = json.loads(data)
        if doc.get("format") != _LINKS_FORMAT or not isinstance(doc.get("files"), dict):
            raise ValueError(f"expected format {_LINKS_FORMAT} with a files map")
        found = {}
        for path, values in doc["files"].items():
            if (not isinstance(values, list) or len(values) != 4
                    or not all(type(v) is int for v in values)):
                raise ValueError(f"{path!r}: expected [ino, size, mtime_ns, ctime_ns]")
            found[path] = Identity(*values)
        return found
    except (ValueError, AttributeError, TypeError) as err:
        raise IntegrityError(f"{where}: unreadable ({str(err)[:120]})") from None


def check_links(data_dir: Path, links: dict[str, Identity]) -> None:
    """IntegrityError naming the first hard-linked file under `data_dir` that was
    rewritten (or replaced, or removed) since it was captured."""
    for path, identity in sorted(links.items()):
        full = data_dir.joinpath(*path.split("/"))
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            raise IntegrityError(f"{full}: missing (captured by hard link)") from None
        moved = identity.drift(st)
        if moved is not None:
            raise IntegrityError(
                f"{full}: changed since it was captured ({moved}); it was captured by hard "
                "link, sharing the trainer's file, and the trainer rewrote it after publishing")
