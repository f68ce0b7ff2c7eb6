"""Where a DCP reader gets a step's bytes: one source per tier, tried in order.

    sources = [LocalSource({0: "/local"}), GlobalSource(store)]   # local -> global
    # with the peer tier (peer_source.py): local -> peer -> global
    sources = [LocalSource({0: "/local"}), PeerSource(credentials, view), GlobalSource(store)]
    sources = tier_sources(store, {0: "/local"})   # the same, from the container's environment

A source is asked for some parts of one file of the committed step (`Want`)
and either provides them, verified, at `want.target`, or declines (None) so
the next source is asked. What a source provides must already match the
committed manifest: a source never hands over a byte it did not verify.

- LocalSource: the local tier of the writer that wrote the file, when this
  node still holds that step with the committed content and the file there
  still has the manifest's size and CRC32C; the whole file, as a symlink.
- PeerSource (peer_source.py): a partner agent's copy of the file's writer's
  step, fetched once per writer over mutual TLS (the whole copy: the peer
  protocol serves whole copies), refused unless its manifest has the
  committed content and every file its CRC32C; then each file as the local
  tier's, checked again and linked. It declines anything unavailable or not
  matching (no server, unreachable, not held, a bad copy), once per writer.
- GlobalSource: ranged GETs from the store. With the manifest's part CRC32Cs,
  only the parts asked for, each checked against its part's CRC32C; without
  them (manifests written before they were kept), the whole file, checked
  against the file's CRC32C. Either way a mismatch raises IntegrityError:
  the store is the last tier, and its wrong bytes are refused, not skipped.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ckptdrain import checksum, keys, paths
from ckptdrain.errors import IntegrityError
from ckptdrain.manifest import FileEntry, WriterManifest
from ckptdrain.node.localtier import LocalTier
from ckptdrain.store.base import Store
from ckptdrain.transfer.fetch import range_size

log = logging.getLogger(__name__)

#: The largest GET of a part: a part is fetched in slices, in parallel, and its
#: CRC32C combined from theirs (the part, not the slice, is what the manifest checks).
SLICE = 4 << 20


@dataclass(frozen=True)
class Want:
    """Parts of one file of a committed step, wanted at `target`."""

    step: int
    manifest: WriterManifest
    entry: FileEntry
    target: Path
    #: Indices into entry.part_spans(); None: the whole file.
    parts: frozenset[int] | None


@dataclass(frozen=True)
class Provided:
    #: The whole file is at the target (else exactly the parts asked for).
    whole: bool
    #: Bytes this source moved or checked to provide it.
    bytes: int


class Source(Protocol):
    """One tier a reader may take a file's bytes from."""

    name: str

    def provide(self, want: Want) -> Provided | None:
        """Put `want`'s bytes, verified, at its target; None to decline."""


class LocalSource:
    """The node's local tier, for the writers whose tier roots are given."""

    name = "local"

    def __init__(self, roots: Mapping[int, str | Path]) -> None:
        self.roots = {int(w): Path(p) for w, p in roots.items()}

    def provide(self, want: Want) -> Provided | None:
        root = self.roots.get(want.manifest.writer)
        if root is None:
            return None
        tier, entry = LocalTier(root), want.entry
        try:
            if not tier.has(want.step) or not tier.manifest(want.step).same_content(
                    want.manifest):
                return None
            source = paths.resolve_under(tier.data_dir(want.step), entry.path)
            size, crc = checksum.crc32c_file(source)
        except (IntegrityError, OSError) as err:
            log.warning("local tier %s step %s unusable for %s: %s", root, want.step,
                        entry.path, err)
            return None
        if size != entry.size or checksum.to_hex(crc) != entry.crc32c:
            log.warning("local tier %s step %s: %s has %d bytes CRC32C %s, manifest says %d "
                        "bytes CRC32C %s; asking the next tier", root, want.step, entry.path,
                        size, checksum.to_hex(crc), entry.size, entry.crc32c)
            return None
        # Published local steps are immutable: a link is as good as a copy.
        # Replacing (not creating) also covers a target another tier filled in part.
        link = want.target.with_name(f".{want.target.name}.link")
        link.unlink(missing_ok=True)
        os.symlink(source, link)
        os.replace(link, want.target)
        return Provided(whole=True, bytes=entry.size)


class GlobalSource:
    """Ranged, verified reads of a committed step's objects from the store."""

    name = "global"

    def __init__(self, store: Store, *, concurrency: int = 8) -> None:
        self.store = store
        self.concurrency = max(1, concurrency)
        # Files are served in parallel too: this bounds the GETs of all of them.
        self._in_flight = threading.BoundedSemaphore(self.concurrency)

    def provide(self, want: Want) -> Provided | None:
        m, entry = want.manifest, want.entry
        key = keys.data_key(m.step, m.writer, entry.path, m.attempt)
        if entry.size == 0:
            info = self.store.head(key)
            if info is None or info.size != 0:
                raise IntegrityError(f"{key}: expected an empty object")
            want.target.touch()
            return Provided(whole=True, bytes=0)
        if entry.part_crc32c is None:
            self._whole_file(key, entry, want.target, m.part_size)
            return Provided(whole=True, bytes=entry.size)
        spans = entry.part_spans()
        wanted = sorted(want.parts) if want.parts is not None else list(range(len(spans)))
        # Slices of the wanted parts, all in flight together (up to `concurrency`
        # GETs across every file this source serves), then checked part by part.
        step = min(range_size(entry.part_size), SLICE)
        slices = [(i, offset + done, min(step, length - done))
                  for i in wanted for offset, length in [spans[i]]
                  for done in range(0, length, step)]
        fd = os.open(want.target, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size != entry.size:
                os.ftruncate(fd, entry.size)  # sparse: only fetched parts take room
            with ThreadPoolExecutor(min(self.concurrency, len(slices))) as pool:
                crcs = list(pool.map(lambda s: self._read(key, entry, s[1], s[2], fd), slices))
        finally:
            os.close(fd)
        by_part: dict[int, int] = {}
        for (index, _, length), crc in zip(slices, crcs, strict=True):
            by_part[index] = checksum.combine(by_part.get(index, 0), crc, length)
        for index in wanted:
            self._check_part(key, entry, index, spans[index], by_part[index])
        return Provided(whole=len(wanted) == len(spans),
                        bytes=sum(spans[i][1] for i in wanted))

    def _read(self, key: str, entry: FileEntry, offset: int, length: int, fd: int) -> int:
        """Read [offset, offset+length) of `key` into `fd`; its CRC32C."""
        # One byte more at the object's end reveals an object longer than listed.
        last = offset + length == entry.size
        with self._in_flight:
            data = self.store.get_range(key, offset, length + 1 if last else length)
        if len(data) != length:
            raise IntegrityError(f"{key}: {'longer' if len(data) > length else 'shorter'} "
                                 f"than the manifest's {entry.size} bytes")
        view, done = memoryview(data), 0
        while done < length:
            done += os.pwrite(fd, view[done:], offset + done)
        return checksum.crc32c(data)

    @staticmethod
    def _check_part(key: str, entry: FileEntry, index: int, span: tuple[int, int],
                    crc: int) -> None:
        assert entry.part_crc32c is not None
        offset, length = span
        if checksum.to_hex(crc) != entry.part_crc32c[index]:
            raise IntegrityError(
                f"{key}: part {index + 1} (bytes {offset}..{offset + length - 1}): CRC32C "
                f"{checksum.to_hex(crc)} does not match the manifest's "
                f"{entry.part_crc32c[index]}; refusing its bytes")

    def _whole_file(self, key: str, entry: FileEntry, target: Path,
                    nominal_part: int | None) -> None:
        """Fetch all of `key`, publish it at `target` only if it matches the file CRC32C."""
        span = range_size(entry.part_size or nominal_part)
        count = -(-entry.size // span)
        partial = target.with_name(f".{target.name}.partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, entry.size)

            def one(index: int) -> tuple[int, int]:
                offset = index * span
                length = min(span, entry.size - offset)
                return self._read(key, entry, offset, length, fd), length

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
