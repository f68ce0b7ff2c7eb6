"""Files of one complete step, from every writer, verified before anyone reads them.

A DCP read plan names byte ranges of files by their path inside a writer's
step (`__1_0.distcp`, `.metadata`); which writer wrote a file is read from
the step's committed manifests, so a path two writers both list is refused
rather than guessed. Each file is laid out under a private directory at its
full size, and only the parts a plan touches are filled in, each at most
once, on first use, from the first source (sources.py) that provides it:
local tier, then (where one is given) a peer, then the global store.

The unit of verification is a part of the file as it was uploaded, when the
manifest lists the parts' CRC32Cs (and they combine to the file's own, else
the manifest contradicts itself and is refused); otherwise, for manifests
written before part CRC32Cs were kept, the whole file. A range is marked
readable only once every part under it verified, so DCP never reads a byte
that did not.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ckptdrain import paths
from ckptdrain.dcp.sources import GlobalSource, LocalSource, Source, Want
from ckptdrain.errors import IntegrityError
from ckptdrain.manifest import FileEntry, WriterManifest
from ckptdrain.store.base import Store
from ckptdrain.transfer.catalog import Checkpoint
from ckptdrain.transfer.partcrcs import agrees

#: (offset, length) ranges of a file; None: the whole file.
Ranges = Sequence[tuple[int, int]] | None


@dataclass
class Stats:
    """What serving the plan cost: bytes and files by tier."""

    bytes: dict[str, int] = field(default_factory=dict)  # tier -> bytes provided
    files: dict[str, str] = field(default_factory=dict)  # path -> the tier that last served it
    parts: int = 0  # parts provided (a whole-file read counts one)

    @property
    def global_bytes(self) -> int:
        return self.bytes.get("global", 0)

    @property
    def local_bytes(self) -> int:
        return self.bytes.get("local", 0)


@dataclass
class _FileState:
    lock: threading.Lock = field(default_factory=threading.Lock)
    whole: bool = False
    parts: set[int] = field(default_factory=set)


def default_sources(store: Store, local: Mapping[int, str | Path] | None = None, *,
                    concurrency: int = 8) -> list[Source]:
    """Local tier (where `local` maps writers to tier roots), then the store."""
    sources: list[Source] = [LocalSource(local)] if local else []
    sources.append(GlobalSource(store, concurrency=concurrency))
    return sources


class VerifiedFiles:
    """Verified parts (or local links) of a step's files under `root`, made on demand."""

    def __init__(self, store: Store, checkpoint: Checkpoint, root: Path, *,
                 local: Mapping[int, str | Path] | None = None, concurrency: int = 8,
                 sources: Iterable[Source] | None = None) -> None:
        self.checkpoint = checkpoint
        self.root = Path(root)
        self.concurrency = max(1, concurrency)
        self.sources = list(sources) if sources is not None else default_sources(
            store, local, concurrency=concurrency)
        if not self.sources:
            raise ValueError("sources: at least one tier is needed to read from")
        self.stats = Stats()
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
        self._state: dict[str, _FileState] = {}
        self._agreed: set[str] = set()
        self._guard = threading.Lock()

    def close(self) -> None:
        """Close the sources that keep copies of their own (a peer tier's fetched
        copies, which the files served under `root` link to)."""
        for source in self.sources:
            close = getattr(source, "close", None)
            if callable(close):
                close()

    def owner(self, relative_path: str) -> int:
        """The writer that holds `relative_path`; IntegrityError if none does."""
        return self._lookup(relative_path)[0].writer

    def ensure(self, relative_paths: Iterable[str]) -> None:
        """Make every one of `relative_paths`, whole, present and verified under `root`."""
        self.ensure_ranges(dict.fromkeys(relative_paths))

    def ensure_ranges(self, needs: Mapping[str, Ranges]) -> None:
        """Make the given ranges of each file (None: all of it) present and verified,
        several files at once; the first failure is raised."""
        order = sorted(needs)
        if len(order) <= 1:
            for path in order:
                self._ensure_one(path, needs[path])
            return
        with ThreadPoolExecutor(min(self.concurrency, len(order))) as pool:
            for _ in pool.map(lambda p: self._ensure_one(p, needs[p]), order):
                pass

    def _lookup(self, relative_path: str) -> tuple[WriterManifest, FileEntry]:
        found = self._owner.get(relative_path)
        if found is None:
            raise IntegrityError(f"step {self.checkpoint.step}: the DCP metadata names "
                                 f"{relative_path!r}, which no writer's manifest lists")
        return found

    def _parts_for(self, entry: FileEntry, ranges: Ranges) -> frozenset[int] | None:
        """The part indices `ranges` cover; None when the whole file is the unit."""
        if entry.part_crc32c is None:
            return None
        # Checked for whole files too: the store's source verifies by parts
        # whenever the manifest lists them.
        if entry.path not in self._agreed and not agrees(entry):
            raise IntegrityError(
                f"step {self.checkpoint.step}: {entry.path!r}: the manifest's part CRC32Cs do "
                f"not combine to its CRC32C {entry.crc32c}; the manifest contradicts itself")
        self._agreed.add(entry.path)  # combining thousands of parts is worth doing once
        if ranges is None:
            return None
        assert entry.part_size is not None
        last = len(entry.part_spans()) - 1
        wanted: set[int] = set()
        for offset, length in ranges:
            if offset < 0 or length < 0 or offset + length > entry.size:
                raise IntegrityError(
                    f"step {self.checkpoint.step}: the DCP metadata asks for bytes "
                    f"{offset}..{offset + length} of {entry.path!r}, which has {entry.size}")
            if length:
                wanted.update(range(offset // entry.part_size,
                                    min(last, (offset + length - 1) // entry.part_size) + 1))
        return frozenset(wanted)

    def _ensure_one(self, relative_path: str, ranges: Ranges) -> None:
        manifest, entry = self._lookup(relative_path)
        with self._guard:
            state = self._state.setdefault(relative_path, _FileState())
        with state.lock:
            if state.whole:
                return
            parts = self._parts_for(entry, ranges)
            missing = None if parts is None else frozenset(parts - state.parts)
            target = paths.resolve_under(self.root, entry.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            if missing is not None and not missing:
                if not target.exists():
                    # Only empty ranges: DCP opens the file and reads nothing from it.
                    with open(target, "wb") as f:
                        f.truncate(entry.size)
                return
            want = Want(self.checkpoint.step, manifest, entry, target, missing)
            for source in self.sources:
                provided = source.provide(want)
                if provided is None:
                    continue
                with self._guard:  # files are served in parallel
                    self.stats.bytes[source.name] = self.stats.bytes.get(source.name, 0) + \
                        provided.bytes
                    self.stats.files[relative_path] = source.name
                    self.stats.parts += 1 if missing is None else len(missing)
                if provided.whole:
                    state.whole = True
                elif missing is not None:
                    state.parts |= missing
                return
            raise IntegrityError(f"step {self.checkpoint.step}: no tier could provide "
                                 f"{relative_path!r} ({', '.join(s.name for s in self.sources)})")
