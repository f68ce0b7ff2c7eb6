"""Build a writer's manifest from a checkpoint directory on local disk."""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ckptdrain import checksum
from ckptdrain.errors import InvalidInput
from ckptdrain.manifest import FileEntry, WriterManifest

SCAN_THREADS = 4
_EXPECTED = "a regular file or directory (symlinks, devices, sockets and FIFOs are refused)"


def _walk(root: Path, rel: str = "") -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    with os.scandir(root / rel if rel else root) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            name = f"{rel}/{entry.name}" if rel else entry.name
            # lstat: a symlink is refused, never followed (it could point anywhere).
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                found.extend(_walk(root, name))
            elif stat.S_ISREG(mode):
                found.append((name, Path(entry.path)))
            else:
                kind = "a symlink" if stat.S_ISLNK(mode) else f"a special file (mode {mode:o})"
                raise InvalidInput(f"source file {entry.path}", _EXPECTED, kind)
    return found


def build_manifest(
    source_dir: Path,
    step: int,
    writer: int,
    writers: int,
    created: float,
    part_size: int | None = None,
) -> WriterManifest:
    """The manifest of every regular file under `source_dir` (sizes and CRC32C).

    Raises InvalidInput for a missing directory, a symlink or a special file,
    and UnsafePath for a name a manifest cannot carry (e.g. a backslash).
    """
    source_dir = Path(source_dir)
    if not source_dir.is_dir() or source_dir.is_symlink():
        raise InvalidInput("source", "an existing directory (not a symlink)", str(source_dir))
    found = _walk(source_dir)
    # Reads release the GIL: a few threads overlap I/O with the checksumming.
    with ThreadPoolExecutor(max_workers=SCAN_THREADS) as pool:
        sums = list(pool.map(checksum.crc32c_file, (path for _, path in found)))
    entries = [FileEntry(rel, size, checksum.to_hex(crc))
               for (rel, _), (size, crc) in zip(found, sums, strict=True)]
    return WriterManifest(
        step=step, writer=writer, writers=writers, files=tuple(entries),
        created=created, part_size=part_size,
    )
