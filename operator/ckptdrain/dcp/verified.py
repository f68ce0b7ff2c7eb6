"""Files of one complete step, from every writer, verified before anyone reads them.

A DCP read plan names files by their path inside a writer's step
(`__1_0.distcp`, `.metadata`); which writer wrote a file is read from the
step's committed manifests, so a path two writers both list is refused
rather than guessed. A file is made available at most once, on first use,
into a private directory:

- from the local tier, when `local` maps the file's writer to a tier root
  that holds the step with the same content as the committed manifest, and
  the file there still has the manifest's size and CRC32C (a symlink, no copy);
- else by ranged GETs from the global store (aligned to the part size the
  file was uploaded with), each range's CRC32C combined into the file's,
  and the file published into the directory only when size and CRC32C match
  the manifest.

The manifest holds one CRC32C per file, so a file is the unit of
verification: a reader fetches only the files its plan touches, and every
byte of such a file, never a byte that did not verify.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ckptdrain import checksum, keys, paths
from ckptdrain.errors import IntegrityError
from ckptdrain.manifest import FileEntry, WriterManifest
from ckptdrain.node.localtier import LocalTier
from ckptdrain.store.base import Store
from ckptdrain.transfer.catalog import Checkpoint
from ckptdrain.transfer.fetch import range_size

log = logging.getLogger(__name__)


@dataclass
class Stats:
    """What serving the plan cost: bytes by tier, files by tier."""

    global_bytes: int = 0
    local_bytes: int = 0
    files: dict[str, str] = field(default_factory=dict)  # path -> "local" or "global"


class VerifiedFiles:
    """Verified copies (or local links) of a step's files under `root`, made on demand."""

    def __init__(self, store: Store, checkpoint: Checkpoint, root: Path, *,
                 local: Mapping[int, Path] | None = None, concurrency: int = 8) -> None:
        self.store = store
        self.checkpoint = checkpoint
        self.root = Path(root)
        self.concurrency = max(1, concurrency)
        self.stats = Stats()
        self._local = dict(local or {})
        self._owner: dict[str, tuple[WriterManifest, FileEntry]] = {}
        for m in checkpoint.manifests:
            for entry in m.files:
                other = self._owner.get(entry.path)
                if other is not None:
                    raise IntegrityError(
                        f"step {checkpoint.step}: writers {other[0].writer} and {m.writer} both "
                        f"hold {entry.path!r}; a DCP checkpoint names each file once (did every "
                        f"rank save without a process group?)")
                self._owner[entry.path] = (m, entry)
        self._ready: set[str] = set()
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def owner(self, relative_path: str) -> int:
        """The writer that holds `relative_path`; IntegrityError if none does."""
        return self._lookup(relative_path)[0].writer

    def ensure(self, relative_paths: set[str]) -> None:
        """Make every one of `relative_paths` present and verified under `root`."""
        for path in sorted(relative_paths):
            self._ensure_one(path)

    def _lookup(self, relative_path: str) -> tuple[WriterManifest, FileEntry]:
        found = self._owner.get(relative_path)
        if found is None:
            raise IntegrityError(f"step {self.checkpoint.step}: the DCP metadata names "
                                 f"{relative_path!r}, which no writer's manifest lists")
        return found

    def _ensure_one(self, relative_path: str) -> None:
        manifest, entry = self._lookup(relative_path)
        with self._guard:
            lock = self._locks.setdefault(relative_path, threading.Lock())
        with lock:
            if relative_path in self._ready:
                return
            target = paths.resolve_under(self.root, entry.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            if self._from_local(manifest, entry, target):
                self.stats.local_bytes += entry.size
                self.stats.files[relative_path] = "local"
            else:
                self._from_store(manifest, entry, target)
                self.stats.global_bytes += entry.size
                self.stats.files[relative_path] = "global"
            self._ready.add(relative_path)

    # -- the local tier -----------------------------------------------------------
    def _from_local(self, manifest: WriterManifest, entry: FileEntry, target: Path) -> bool:
        root = self._local.get(manifest.writer)
        if root is None:
            return False
        tier = LocalTier(root)
        step = self.checkpoint.step
        try:
            if not tier.has(step) or not tier.manifest(step).same_content(manifest):
                return False
            source = paths.resolve_under(tier.data_dir(step), entry.path)
            size, crc = checksum.crc32c_file(source)
        except (IntegrityError, OSError) as err:
            log.warning("local tier %s step %s unusable for %s: %s", root, step, entry.path, err)
            return False
        if size != entry.size or checksum.to_hex(crc) != entry.crc32c:
            log.warning("local tier %s step %s: %s has %d bytes CRC32C %s, manifest says %d "
                        "bytes CRC32C %s; reading it from the store", root, step, entry.path,
                        size, checksum.to_hex(crc), entry.size, entry.crc32c)
            return False
        # Published local steps are immutable: a link is as good as a copy.
        os.symlink(source, target)
        return True

    # -- the global store -----------------------------------------------------------
    def _from_store(self, manifest: WriterManifest, entry: FileEntry, target: Path) -> None:
        key = keys.data_key(manifest.step, manifest.writer, entry.path, manifest.attempt)
        span = range_size(entry.part_size or manifest.part_size)
        count = max(1, -(-entry.size // span))
        partial = target.with_name(f".{target.name}.partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, entry.size)

            def one(index: int) -> tuple[int, int]:
                offset = index * span
                length = min(span, entry.size - offset)
                last = offset + length == entry.size
                # One byte more on the last range reveals an object longer than listed.
                data = self.store.get_range(key, offset, length + 1 if last else length)
                if len(data) != length:
                    raise IntegrityError(
                        f"{key}: {'longer' if len(data) > length else 'shorter'} than the "
                        f"manifest's {entry.size} bytes")
                view, done = memoryview(data), 0
                while done < length:
                    done += os.pwrite(fd, view[done:], offset + done)
                return checksum.crc32c(data), length

            if entry.size == 0:
                info = self.store.head(key)
                if info is None or info.size != 0:
                    raise IntegrityError(f"{key}: expected an empty object")
                crcs = [(0, 0)]
            else:
                with ThreadPoolExecutor(min(self.concurrency, count)) as pool:
                    crcs = list(pool.map(one, range(count)))
            crc = 0
            for part_crc, length in crcs:
                crc = checksum.combine(crc, part_crc, length)
            if checksum.to_hex(crc) != entry.crc32c:
                raise IntegrityError(
                    f"{key}: CRC32C {checksum.to_hex(crc)} does not match the manifest's "
                    f"{entry.crc32c}; refusing its bytes")
        except BaseException:
            os.close(fd)
            partial.unlink(missing_ok=True)
            raise
        os.close(fd)
        os.replace(partial, target)
