"""The restore engine: newest complete checkpoint → verified files at `dest`, atomically.

Layout: with `writer` given, that writer's files land directly under `dest`
(what a restore init container wants). With `writer=None` (what `ckptdrain
pull` does) a single-writer checkpoint also lands directly under `dest`, so
push then pull mirrors the source; a checkpoint of N > 1 writers lands under
`dest/<writer>/` (decimal, no padding), one directory per writer.

Every path is checked (paths.resolve_under) before anything is written. Files
are fetched with parallel ranged GETs aligned to each file's part size (never
below MIN_RANGE nor above MAX_RANGE, or MAX_FILE_RANGE where no buffer holds
a whole range (transfer/range_fetch.py), whatever the manifest says; ranges are
handed out one at a time, so a hostile size allocates nothing up front) into
a temporary directory beside `dest`; each range's CRC32C is taken as it
arrives (or read back from the file the store wrote it into) and combined
per file. Only a
fully verified checkpoint is renamed into place: `dest` shows either nothing
or all of it. A corrupt or incomplete candidate is skipped, with its reason
recorded, and the next newest tried (unless a step was asked for). What is
placed is shared with the pod's group as it is made (group_access.py:
directories 0o2775, files 0o664), so a trainer of another uid reads what
restore (uid 65532) fetched.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ckptdrain import checksum, cpus, group_access, keys, paths
from ckptdrain.errors import (
    CkptdrainError,
    IntegrityError,
    InvalidInput,
    NoCheckpoint,
    ObjectMissing,
)
from ckptdrain.manifest import FileEntry, WriterManifest
from ckptdrain.store.base import Store
from ckptdrain.transfer import range_fetch
from ckptdrain.transfer.catalog import Checkpoint, candidate_steps, load_checkpoint
from ckptdrain.transfer.range_fetch import MAX_RANGE
from ckptdrain.transfer.staging import remove_stale_staging, staging_prefix

#: Smallest ranged GET: below it, per-request overhead dominates (a manifest's
#: or a user's tiny part size must not turn a pull into a million requests).
MIN_RANGE = 1 << 20
#: Ranged GETs in flight per CPU the restore may use, and the bounds. More
#: threads than this only fight over the interpreter lock: on two cores, 16
#: in flight measured 650 MB/s at 1.75 core-s/GB where 4 gave 840 MB/s at
#: 1.2 core-s/GB (MinIO on loopback, 2 GiB).
STREAMS_PER_CPU, MIN_STREAMS, MAX_STREAMS = 2, 4, 16
#: What a manifest's size may do to this filesystem: say so as the step's problem.
_FS_REFUSALS = {errno.EFBIG, errno.ENAMETOOLONG, errno.EOVERFLOW, errno.EINVAL}


@dataclass(frozen=True)
class FetchResult:
    step: int
    writers: list[int]
    bytes: int
    seconds: float
    source_uri: str
    dest: Path
    skipped: list[str] = field(default_factory=list)
    #: How the ranges were to be written: "direct" (by direct I/O onto a
    #: local disk), "spliced" or "buffered" (range_fetch.py says when each
    #: is used); and how many bytes went by direct I/O (a file's unaligned
    #: tail does not, nor anything after its filesystem refused it).
    io: str = range_fetch.BUFFERED
    direct_bytes: int = 0


@dataclass
class _File:
    entry: FileEntry
    key: str
    target: Path
    ranges: int
    range_size: int = MAX_RANGE
    crcs: dict[int, tuple[int, int]] = field(default_factory=dict)  # index -> (crc, length)


def _plan(ckpt: Checkpoint, root: Path, writer: int | None, part_size: int | None = None,
          largest: int = MAX_RANGE, mode: str = range_fetch.BUFFERED) -> list[_File]:
    """Every file to fetch and where it goes; refuses unsafe paths before any write."""
    if writer is not None and not 0 <= writer < ckpt.writers:
        raise NoCheckpoint(f"step {ckpt.step} has writers 0..{ckpt.writers - 1}, not {writer}")
    chosen = ckpt.manifests if writer is None else (ckpt.manifests[writer],)
    plan = []
    for m in chosen:
        flat = writer is not None or ckpt.writers == 1
        base = root if flat else root / str(m.writer)
        for entry in m.files:
            target = paths.resolve_under(base, entry.path)
            key = keys.data_key(m.step, m.writer, entry.path, m.attempt)
            size = range_fetch.aligned_range(
                mode, range_size(part_size or entry.part_size or m.part_size, largest))
            plan.append(_File(entry, key, target, 0, size))
    return plan


def range_size(part: int | None, largest: int = MAX_RANGE) -> int:
    """The ranged-GET size for an object uploaded in parts of `part` bytes:
    the part itself or equal slices of it, always in MIN_RANGE..largest."""
    if part is None or part <= 0:
        return largest
    if part <= largest:
        return max(part, MIN_RANGE)
    # Equal slices of a part, so no GET straddles two parts on the server;
    # read into a buffer, 16 MiB GETs measured ~3x faster than 64 MiB ones
    # (less buffering in urllib3).
    n = -(-part // largest)
    return max(part // n, MIN_RANGE) if part % n == 0 else largest


def default_concurrency() -> int:
    """Ranged GETs in flight when the caller does not say: two per usable CPU
    (cgroup quota included), at least 4 (latency hides behind them), at most 16."""
    return max(MIN_STREAMS, min(MAX_STREAMS, STREAMS_PER_CPU * cpus.usable_cpus()))


def _prepare_target(f: _File) -> None:
    """Create the file, preallocated (sparse); a size or name this filesystem
    refuses is an integrity problem of the step, not a crash."""
    try:
        _shared_dirs(f.target.parent)
        with open(f.target, "wb") as out:
            os.fchmod(out.fileno(), group_access.FILE_MODE)  # never the umask's
            out.truncate(f.entry.size)  # preallocated; ranges land with pwrite
    except OSError as err:
        if err.errno not in _FS_REFUSALS:
            raise
        raise IntegrityError(f"{f.key}: cannot be a file of {f.entry.size} bytes here: "
                             f"{err.strerror}") from None


def _shared_dirs(directory: Path) -> None:
    """`directory` and its missing parents, each made shared as it is made
    (a parent that exists is left as it is: it is the staging root, shared
    already, or above it)."""
    if directory.is_dir():
        return
    _shared_dirs(directory.parent)
    directory.mkdir(exist_ok=True)
    group_access.share(directory)


def _download(store: Store, mode: str, files: list[_File], concurrency: int,
              progress: Callable[[int], None] | None) -> int:
    """Every range of `files`; how many bytes went by direct I/O."""
    for f in files:
        _prepare_target(f)
        f.ranges = max(1, -(-f.entry.size // f.range_size))
    # Handed out one at a time: nothing is allocated per range before it is fetched.
    work = itertools.chain.from_iterable(((f, i) for i in range(f.ranges)) for f in files)
    errors: list[BaseException] = []
    lock = threading.Lock()
    done = [0, 0]  # bytes fetched, of which written by direct I/O

    biggest = max((min(f.range_size, f.entry.size) for f in files), default=0)

    def worker() -> None:
        buffer = range_fetch.worker_buffer(store, mode, biggest)
        while not errors:
            with lock:
                item = next(work, None)
            if item is None:
                return
            f, i = item
            try:
                direct = _fetch_range(store, mode, f, i, buffer)
                with lock:
                    done[0] += f.crcs[i][1]
                    done[1] += direct
                    if progress:
                        progress(done[0])
            except BaseException as err:
                errors.append(err)
                return

    # No more threads than ranges: each holds a buffer, and a thread with no
    # range to fetch would only cost memory.
    ranges = sum(f.ranges for f in files)
    threads = [threading.Thread(target=worker, daemon=True, name=f"ckptdrain-fetch-{n}")
               for n in range(max(1, min(concurrency, ranges)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return done[1]


def _fetch_range(store: Store, mode: str, f: _File, index: int,
                 buffer: memoryview | None) -> int:
    size = f.entry.size
    offset = index * f.range_size
    if size == 0:
        info = store.head(f.key)
        if info is None or info.size != 0:
            raise IntegrityError(f"{f.key}: expected an empty object, store has "
                                 f"{'nothing' if info is None else f'{info.size} bytes'}")
        f.crcs[index] = (0, 0)
        return 0
    length = min(f.range_size, size - offset)
    crc, direct = range_fetch.fetch_range(store, mode, f.key, f.target, size, offset, length,
                                          buffer)
    f.crcs[index] = (crc, length)
    return direct


def _verify(files: list[_File]) -> None:
    for f in files:
        crc, total = 0, 0
        for i in range(f.ranges):
            part_crc, length = f.crcs[i]
            crc = checksum.combine(crc, part_crc, length)
            total += length
        if total != f.entry.size or checksum.to_hex(crc) != f.entry.crc32c:
            raise IntegrityError(
                f"{f.key}: CRC32C {checksum.to_hex(crc)} does not match the manifest's "
                f"{f.entry.crc32c}")


def _place(tmp: Path, dest: Path) -> None:
    """Rename the verified tree into place; dest must be missing or empty."""
    if dest.exists():
        if not dest.is_dir() or any(dest.iterdir()):
            raise InvalidInput("dest", "a missing or empty directory", str(dest))
        dest.rmdir()
    os.replace(tmp, dest)
    dir_fd = os.open(dest.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _fsync_tree(files: list[_File]) -> None:
    for f in files:
        fd = os.open(f.target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fetch(
    store: Store,
    dest: Path,
    *,
    step: int | None = None,
    writer: int | None = None,
    concurrency: int | None = None,
    part_size: int | None = None,
    progress: Callable[[int], None] | None = None,
    direct_io: bool = True,
    on_total: Callable[[int], None] | None = None,
) -> FetchResult:
    """Restore the newest complete checkpoint (or `step`) into `dest`, verified.

    `progress` gets the bytes fetched so far for the current candidate, and
    `on_total` each candidate's size before its first byte (a progress bar's total);
    `concurrency` (ranged GETs in flight) defaults to default_concurrency().
    `direct_io` False keeps the files written through the page cache (and
    left in it) even onto a disk.

    Raises NoCheckpoint when no candidate is complete and intact (the reasons
    are in the message), InvalidInput when `dest` is not empty."""
    started = time.monotonic()
    dest = Path(dest).absolute()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InvalidInput("dest", "a missing or empty directory", str(dest))
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(dest)
    mode = range_fetch.choose(store, dest.parent, direct_io)
    steps = [step] if step is not None else candidate_steps(store)
    skipped: list[str] = []
    for candidate in steps:
        tmp = Path(tempfile.mkdtemp(prefix=staging_prefix(dest, os.getpid()), dir=dest.parent))
        group_access.share(tmp)  # mkdtemp makes it 0o700: the trainer could not enter it
        try:
            ckpt = load_checkpoint(store, candidate)
            files = _plan(ckpt, tmp, writer, part_size, range_fetch.largest_range(store, mode),
                          mode)
            if on_total is not None:
                on_total(sum(f.entry.size for f in files))
            streams = default_concurrency() if concurrency is None else concurrency
            direct = _download(store, mode, files, streams, progress)
            _verify(files)
            _fsync_tree(files)
            _place(tmp, dest)
        except (IntegrityError, ObjectMissing) as err:
            # Corrupt or incomplete: try the next newest (unless a step was asked for).
            shutil.rmtree(tmp, ignore_errors=True)
            if step is not None:
                raise
            skipped.append(f"step {candidate}: {err}")
            continue
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        writers = list(range(ckpt.writers)) if writer is None else [writer]
        return FetchResult(
            step=candidate, writers=writers, bytes=sum(f.entry.size for f in files),
            seconds=time.monotonic() - started, source_uri=store.uri, dest=dest,
            skipped=skipped,
            io=mode, direct_bytes=direct,
        )
    detail = "; ".join(skipped) if skipped else "the store holds no manifests"
    raise NoCheckpoint(f"no complete, intact checkpoint in {store.uri}: {detail}")


def verify_dir(directory: Path, manifest: WriterManifest) -> list[str]:
    """Problems with `directory` against `manifest` (empty list: all files match)."""
    problems = []
    for entry in manifest.files:
        try:
            path = paths.resolve_under(directory, entry.path)
        except IntegrityError as err:
            problems.append(str(err))
            continue
        if not path.is_file():
            problems.append(f"{entry.path}: missing")
            continue
        size, crc = checksum.crc32c_file(path)
        if size != entry.size or checksum.to_hex(crc) != entry.crc32c:
            problems.append(f"{entry.path}: {size} bytes CRC32C {checksum.to_hex(crc)}, manifest "
                            f"says {entry.size} bytes CRC32C {entry.crc32c}")
    return problems


def verify_store(store: Store, step: int, read_size: int = MAX_RANGE) -> list[str]:
    """Problems with `step` in the store: manifests, then every object's size and CRC32C."""
    try:
        ckpt = load_checkpoint(store, step)
    except IntegrityError as err:
        return [str(err)]
    problems = []
    for m in ckpt.manifests:
        for entry in m.files:
            key = keys.data_key(m.step, m.writer, entry.path, m.attempt)
            read = min(max(read_size, MIN_RANGE), MAX_RANGE)
            crc, offset = 0, 0
            # Named as the trainer named the file; the key is the store's business.
            where = f"writer {m.writer}: {entry.path}"
            try:
                if entry.size == 0:
                    info = store.head(key)
                    offset = -1 if info is None else info.size
                while 0 <= offset < entry.size:
                    want = min(read, entry.size - offset)
                    last = offset + want == entry.size
                    # One byte more on the last range reveals an object that is too long.
                    data = store.get_range(key, offset, want + 1 if last else want)
                    crc = checksum.crc32c(data, crc)
                    offset += len(data)
                    if len(data) != want:
                        break
            except ObjectMissing:
                problems.append(f"{where}: missing from the store")
                continue
            except CkptdrainError as err:
                problems.append(f"{where}: {err}")
                continue
            if offset != entry.size or checksum.to_hex(crc) != entry.crc32c:
                problems.append(f"{where}: {offset} bytes CRC32C {checksum.to_hex(crc)}, manifest "
                                f"says {entry.size} bytes CRC32C {entry.crc32c}")
    return problems
