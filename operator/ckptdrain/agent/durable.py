"""Durable, checksummed copies of a directory tree (capture and local restore).

One pass per file: read a large buffer, fold it into the CRC32C, write it;
fsync the file at its end. Checksumming on the way costs ~0.1 core-s/GB
(awscrt), so a capture needs no second read to build its manifest, and a
restore from the local tier verifies while it copies.

Durability order (what makes a crash at any point harmless): every file is
fsync'd, then every directory below the temporary root, and only then does
the caller rename the root into place and fsync its parent.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ckptdrain import checksum, paths
from ckptdrain.errors import CkptdrainError, IntegrityError
from ckptdrain.manifest import FileEntry

#: 8 MiB buffers: large enough that syscalls and the CRC call overhead vanish,
#: small enough that a few copy threads stay far below the RSS budget.
BUFFER_SIZE = 8 << 20
#: One copy thread per core (at most 4): copying is memory-bound, and more
#: threads than cores only add contention on a node that is also training.
DEFAULT_WORKERS = max(1, min(4, os.cpu_count() or 1))

StopCheck = Callable[[], bool]


class CopyAborted(CkptdrainError):
    """The copy was asked to stop (deadline or a second SIGTERM); nothing was published."""


def list_files(root: Path) -> list[str]:
    """Relative '/'-paths of the regular files under `root`, sorted.

    Symlinks and special files are refused: a checkpoint is plain files, and
    following a link could capture something outside the checkpoint.
    """
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for name in dirnames:
            if (base / name).is_symlink():
                raise IntegrityError(f"{base / name}: symlinks are not allowed in a checkpoint")
        for name in filenames:
            full = base / name
            if full.is_symlink() or not full.is_file():
                raise IntegrityError(f"{full}: only regular files are allowed in a checkpoint")
            rel = full.relative_to(root).as_posix()
            found.append(paths.check_relative_path(rel))
    found.sort()
    return found


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_file(
    src: Path, dst: Path, *, should_stop: StopCheck | None = None, buffer_size: int = BUFFER_SIZE
) -> tuple[int, int]:
    """Copy `src` to a new file `dst`, fsync it, and return (size, CRC32C)."""
    buf = bytearray(buffer_size)
    view = memoryview(buf)
    crc, size = 0, 0
    fin = os.open(src, os.O_RDONLY)
    try:
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.posix_fadvise(fin, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            while True:
                if should_stop is not None and should_stop():
                    raise CopyAborted(f"copy of {src} stopped")
                n = os.readv(fin, [buf])
                if not n:
                    break
                chunk = view[:n]
                crc = checksum.crc32c(chunk, crc)
                written = 0
                while written < n:
                    written += os.write(fout, chunk[written:])
                size += n
            # Start writeback now (async) so the fsync below finds little left to
            # do; it also keeps the copy from evicting the trainer's page cache.
            os.posix_fadvise(fout, 0, 0, os.POSIX_FADV_DONTNEED)
            os.fsync(fout)
        finally:
            os.close(fout)
    finally:
        os.close(fin)
    return size, crc


def copy_tree(
    src: Path,
    dst: Path,
    *,
    files: Iterable[str] | None = None,
    expected: dict[str, FileEntry] | None = None,
    should_stop: StopCheck | None = None,
    workers: int = DEFAULT_WORKERS,
) -> list[FileEntry]:
    """Copy `files` (default: all) from `src` into the new directory `dst`.

    Returns one FileEntry per file, measured from the bytes actually read.
    With `expected`, a file whose size or CRC differs raises IntegrityError.
    Every file and directory under `dst` is fsync'd before this returns;
    on any error `dst` is removed, so a caller never publishes a partial copy.
    """
    rels = sorted(files) if files is not None else list_files(src)
    dst.mkdir(parents=True, exist_ok=False)
    try:
        dirs = {dst}
        for rel in rels:
            target = paths.resolve_under(dst, rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            dirs.update(p for p in target.parents if p.is_relative_to(dst))

        def one(rel: str) -> FileEntry:
            size, crc = copy_file(
                src.joinpath(*rel.split("/")), dst.joinpath(*rel.split("/")),
                should_stop=should_stop,
            )
            entry = FileEntry(rel, size, checksum.to_hex(crc))
            want = None if expected is None else expected.get(rel)
            if expected is not None and (want is None or want != entry):
                raise IntegrityError(
                    f"{src / rel}: have {entry.size} bytes crc32c {entry.crc32c},"
                    f" manifest says {want.size if want else '-'} bytes"
                    f" crc32c {want.crc32c if want else '-'}"
                )
            return entry

        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(rels) or 1))) as pool:
            entries = list(pool.map(one, rels))
        # Deepest first, so each directory's entries are durable before its parent's.
        for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
            fsync_dir(d)
        return entries
    except BaseException:
        shutil.rmtree(dst, ignore_errors=True)
        raise


def verify_tree(root: Path, expected: Iterable[FileEntry], *, workers: int = 2) -> None:
    """Re-read every file under `root` against its entry; raise IntegrityError on the first
    missing, extra, resized or corrupt file."""
    entries = {e.path: e for e in expected}
    present = set(list_files(root)) if root.is_dir() else set()
    missing = sorted(set(entries) - present)
    extra = sorted(present - set(entries))
    if missing or extra:
        raise IntegrityError(f"{root}: missing {missing[:5]} extra {extra[:5]}")

    def one(entry: FileEntry) -> None:
        size, crc = checksum.crc32c_file(root.joinpath(*entry.path.split("/")))
        if size != entry.size or checksum.to_hex(crc) != entry.crc32c:
            raise IntegrityError(
                f"{root / entry.path}: {size} bytes crc32c {checksum.to_hex(crc)},"
                f" manifest says {entry.size} bytes crc32c {entry.crc32c}"
            )

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, entries.values()))


def publish(tmp: Path, final: Path) -> None:
    """Rename a fully durable temporary directory into place, durably."""
    os.rename(tmp, final)
    fsync_dir(final.parent)
