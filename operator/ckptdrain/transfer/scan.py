"""Build a writer's manifest from a checkpoint directory on local disk."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ckptdrain import checksum
from ckptdrain.errors import UnsafeSource
from ckptdrain.localfs import regular_files, shown
from ckptdrain.manifest import FileEntry, WriterManifest

SCAN_THREADS = 4


def build_manifest(
    source_dir: Path,
    step: int,
    writer: int,
    writers: int,
    created: float,
    part_size: int | None = None,
) -> WriterManifest:
    """The manifest of every regular file under `source_dir` (sizes and CRC32C).

    Raises UnsafeSource (an InvalidInput) for a missing or empty directory, a
    symlink, a special file or a name a manifest cannot carry (e.g. a newline).
    """
    found = regular_files(Path(source_dir))
    if not found:
        raise UnsafeSource("source", "a directory holding at least one file (a checkpoint "
                           "is never empty)", f"{shown(source_dir)} (no files)")
    # Reads release the GIL: a few threads overlap I/O with the checksumming.
    with ThreadPoolExecutor(max_workers=SCAN_THREADS) as pool:
        sums = list(pool.map(checksum.crc32c_file, (path for _, path in found)))
    entries = [FileEntry(rel, size, checksum.to_hex(crc))
               for (rel, _), (size, crc) in zip(found, sums, strict=True)]
    return WriterManifest(
        step=step, writer=writer, writers=writers, files=tuple(entries),
        created=created, part_size=part_size,
    )
