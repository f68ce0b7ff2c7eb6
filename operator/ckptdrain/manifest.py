"""Per-writer checkpoint manifests: what a writer's part of a step holds.

A checkpoint is a step plus `writers` writers (ranks 0..writers-1). Each
writer's manifest lists every file's relative path, size and CRC32C. A
manifest is the commit record: it is written only after every object it
lists is durable, and a checkpoint is complete only when all its writers'
manifests exist and agree.

Format 2 names the upload attempt whose data it commits (keys.py derives the
data keys from it) and, per file, the part size the file was uploaded with.
Format 3 is format 2 in the spread layout: its attempt id starts with "s"
and its data lives under a short hash of the writer (keys.py, prefix
spreading); a reader of formats 1-2 refuses it by its number instead of
looking for its data in the wrong place. Format 1 (no attempt, no per-file
part size) is still read: its data lives under the writer's prefix directly.

A format-2 file entry may also list the CRC32C of each part it was uploaded
in (`part_crc32c`), so a reader can verify a range of a large file by the
parts it covers instead of reading the whole file. It is optional: manifests
written before it, and files whose parts a resumed drain no longer knew,
lack it, and their readers verify whole files. Readers that predate it
ignore it.

A manifest comes back from the network: parsing validates everything and
bounds every number, and any problem with it (bad JSON, nesting, unicode,
types, absurd sizes, names no filesystem takes) is an IntegrityError (or
UnsafePath), never another exception.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from ckptdrain import checksum, paths
from ckptdrain.errors import IntegrityError, UnsafePath

#: The format every new manifest is written in (the spread layout); 1-2 still read.
FORMAT_VERSION = 3
SUPPORTED_FORMATS = (1, 2, 3)
#: Upper bound on a manifest we are willing to parse (a million files fits).
MAX_MANIFEST_BYTES = 256 << 20
MAX_WRITERS = 100_000
#: S3's limits on a multipart upload: no real object is larger than this.
MAX_PARTS = 10_000
MAX_PART_BYTES = 5 << 30
MAX_FILE_BYTES = MAX_PARTS * MAX_PART_BYTES
#: A name component longer than this fits no common filesystem (NAME_MAX).
MAX_NAME_BYTES = 255
#: The store's 1024-byte key limit, less the data prefix keys.py puts before a
#: path in the spread layout (format 3), which every new drain writes ...
MAX_STORE_PATH_BYTES = 1024 - len("data/00/00000000000000000000/00000/s0123456789abcdef/")
#: ... and in the layouts before it (formats 1-2), whose prefix is 4 bytes
#: shorter: manifests the releases before spreading wrote up to this must keep
#: restoring, so a file entry is held to this, and a spread manifest to the above.
MAX_OLD_LAYOUT_PATH_BYTES = 1024 - len("data/00000000000000000000/00000/0123456789abcdef/")
#: 16 lowercase hex digits; after an "s" in the spread layout (format 3).
_ATTEMPT = re.compile(r"s?[0-9a-f]{16}")

#: The manifest extra naming the timeline a local copy was captured in (the
#: restore agreement's id, restore/agreement.py): copies of one step number
#: from two timelines must never be restored together.
EXTRA_TIMELINE = "timeline"


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_attempt(attempt: object) -> str:
    """`attempt` if it is an attempt id (16 lowercase hex digits, after an "s"
    in the spread layout), else IntegrityError."""
    if not isinstance(attempt, str) or not _ATTEMPT.fullmatch(attempt):
        raise IntegrityError(f"manifest attempt must be 16 lowercase hex digits (after an "
                             f"'s' in the spread layout), got {attempt!r:.60}")
    return attempt


def is_spread(attempt: str | None) -> bool:
    """Whether the attempt's data is in the spread layout (keys.py)."""
    return attempt is not None and attempt.startswith("s")


def _check_store_path(path: str, limit: int = MAX_OLD_LAYOUT_PATH_BYTES) -> None:
    """A path a store key (of a layout allowing `limit` bytes for it) and a
    filesystem can both hold (after paths' own checks)."""
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafePath(f"manifest path is not valid unicode: {path[:64]!r}") from None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        # XML 1.0 (S3 listings) cannot carry most of them; no trainer needs them.
        raise UnsafePath(f"manifest path contains a control character: {path[:64]!r}")
    if len(encoded) > limit:
        raise UnsafePath(f"manifest path longer than {limit} bytes: {path[:64]!r}…")
    for part in path.split("/"):
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            raise UnsafePath(f"manifest path has a name longer than {MAX_NAME_BYTES} bytes: "
                             f"{part[:64]!r}…")


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    crc32c: str  # 8 lowercase hex digits
    #: Part size the file was uploaded with (format 2); its object has
    #: ceil(size / part_size) parts (one, sent whole, when size <= part_size).
    part_size: int | None = None
    #: CRC32C of each part, in order (8 lowercase hex digits each), or None.
    part_crc32c: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        paths.check_relative_path(self.path)
        _check_store_path(self.path)
        if not _whole(self.size) or not 0 <= self.size <= MAX_FILE_BYTES:
            raise IntegrityError(f"{self.path!r}: size must be a whole number in "
                                 f"0..{MAX_FILE_BYTES}, got {self.size!r:.40}")
        if not isinstance(self.crc32c, str):
            raise IntegrityError(f"{self.path!r}: crc32c must be a string, got {self.crc32c!r:.40}")
        try:
            checksum.from_hex(self.crc32c)
        except ValueError as err:
            raise IntegrityError(f"{self.path!r}: {err}") from None
        if self.part_size is not None:
            check_part_size(self.part_size, f"{self.path!r}: part_size")
            if -(-self.size // self.part_size) > MAX_PARTS:
                raise IntegrityError(f"{self.path!r}: {self.size} bytes in parts of "
                                     f"{self.part_size} is more than {MAX_PARTS} parts")
        if self.part_crc32c is not None:
            self._check_part_crcs()

    def part_spans(self) -> list[tuple[int, int]]:
        """(offset, length) of each part the file was uploaded in (one for an
        empty file or one sent whole); needs part_size."""
        if self.part_size is None:
            raise IntegrityError(f"{self.path!r}: no part_size, so no parts")
        if self.size <= self.part_size:
            return [(0, self.size)]
        return [(o, min(self.part_size, self.size - o))
                for o in range(0, self.size, self.part_size)]

    def _check_part_crcs(self) -> None:
        crcs = self.part_crc32c
        if not isinstance(crcs, tuple) or self.part_size is None:
            raise IntegrityError(f"{self.path!r}: part_crc32c must be a list and needs "
                                 f"part_size, got {crcs!r:.60}")
        want = len(self.part_spans())
        if len(crcs) != want:
            raise IntegrityError(f"{self.path!r}: part_crc32c lists {len(crcs)} parts, "
                                 f"{self.size} bytes in parts of {self.part_size} are {want}")
        for crc in crcs:
            if not isinstance(crc, str):
                raise IntegrityError(f"{self.path!r}: part_crc32c entries must be strings, "
                                     f"got {crc!r:.40}")
            try:
                checksum.from_hex(crc)
            except ValueError as err:
                raise IntegrityError(f"{self.path!r}: part_crc32c: {err}") from None


def check_part_size(value: object, what: str = "manifest part_size") -> int:
    if not _whole(value) or not 1 <= value <= MAX_PART_BYTES:  # type: ignore[operator]
        raise IntegrityError(f"{what} must be a whole number in 1..{MAX_PART_BYTES}, "
                             f"got {value!r:.40}")
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class WriterManifest:
    step: int
    writer: int
    writers: int
    files: tuple[FileEntry, ...]
    created: float  # Unix seconds, from the writer's clock
    #: The drain's nominal part size (each file records the one it used).
    part_size: int | None = None
    #: The upload attempt whose data this manifest commits (format 2); None: format 1.
    attempt: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_step(self.step)
        for name in ("writer", "writers"):
            value = getattr(self, name)
            if not _whole(value):
                raise IntegrityError(f"manifest {name} must be a whole number, got {value!r:.40}")
        if not 1 <= self.writers <= MAX_WRITERS:
            raise IntegrityError(f"manifest writers must be in 1..{MAX_WRITERS}, "
                                 f"got {self.writers}")
        if not 0 <= self.writer < self.writers:
            raise IntegrityError(
                f"manifest writer {self.writer} outside 0..{self.writers - 1}"
                f" (writers={self.writers})"
            )
        if (not isinstance(self.created, int | float) or isinstance(self.created, bool)
                or not math.isfinite(self.created)):
            raise IntegrityError(f"manifest created must be a finite number, "
                                 f"got {self.created!r:.40}")
        if self.part_size is not None:
            check_part_size(self.part_size)
        if self.attempt is not None:
            check_attempt(self.attempt)
            if any(f.part_size is None for f in self.files):
                raise IntegrityError("manifest format 2 needs every file's part_size")
            if is_spread(self.attempt):
                for f in self.files:  # its data keys are longer than the old layouts'
                    _check_store_path(f.path, MAX_STORE_PATH_BYTES)
        if not self.files:
            # A trainer always writes something: an empty list is a walk that
            # found nothing or a manifest someone emptied, never a checkpoint.
            raise IntegrityError("manifest lists no files: a checkpoint is never empty")
        paths.check_path_set(f.path for f in self.files)

    @property
    def format(self) -> int:
        """3 in the spread layout, 2 when the manifest names its attempt, else 1
        (the layout without one)."""
        if self.attempt is None:
            return 1
        return 3 if is_spread(self.attempt) else 2

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def same_content(self, other: WriterManifest) -> bool:
        """The same checkpoint: step, writer, writers and files (path, size, CRC32C).
        Attempt, part sizes, creation time and extras do not count."""
        def files(m: WriterManifest) -> set[tuple[str, int, str]]:
            return {(f.path, f.size, f.crc32c) for f in m.files}
        return ((self.step, self.writer, self.writers) == (other.step, other.writer, other.writers)
                and files(self) == files(other))

    def to_json(self) -> bytes:
        """Deterministic JSON (sorted keys, files sorted by path)."""
        def entry(f: FileEntry) -> dict[str, Any]:
            out: dict[str, Any] = {"path": f.path, "size": f.size, "crc32c": f.crc32c}
            if f.part_size is not None:
                out["part_size"] = f.part_size
            if f.part_crc32c is not None:
                out["part_crc32c"] = list(f.part_crc32c)
            return out

        doc: dict[str, Any] = {
            "format": self.format,
            "step": self.step,
            "writer": self.writer,
            "writers": self.writers,
            "created": self.created,
            "part_size": self.part_size,
            "files": [entry(f) for f in sorted(self.files, key=lambda e: e.path)],
            "extra": dict(self.extra),
        }
        if self.attempt is not None:
            doc["attempt"] = self.attempt
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> WriterManifest:
        """Parse and validate; raise IntegrityError (or UnsafePath) on anything off."""
        if not isinstance(data, bytes | bytearray):
            raise IntegrityError("manifest must be bytes")
        if len(data) > MAX_MANIFEST_BYTES:
            raise IntegrityError(f"manifest larger than {MAX_MANIFEST_BYTES} bytes")
        try:
            return cls._parse(json.loads(data))
        except IntegrityError:
            raise
        except RecursionError:
            raise IntegrityError("manifest is nested too deeply") from None
        except (ValueError, TypeError, OverflowError, UnicodeError, AttributeError) as err:
            # JSONDecodeError and UnicodeDecodeError are ValueErrors; huge
            # integers and wrong types end here too, whatever their depth.
            raise IntegrityError(f"manifest is not valid: {str(err)[:200]}") from None

    @classmethod
    def _parse(cls, doc: object) -> WriterManifest:
        if not isinstance(doc, dict):
            raise IntegrityError("manifest must be a JSON object")
        missing = {"format", "step", "writer", "writers", "created", "files"} - doc.keys()
        if missing:
            raise IntegrityError(f"manifest lacks {', '.join(sorted(missing))}")
        fmt = doc["format"]
        if not _whole(fmt) or fmt not in SUPPORTED_FORMATS:
            raise IntegrityError(f"manifest format {fmt!r:.40} not supported "
                                 f"(want one of {SUPPORTED_FORMATS})")
        attempt = doc.get("attempt")
        if fmt in (2, 3):
            if is_spread(check_attempt(attempt)) != (fmt == 3):
                raise IntegrityError(f"a format-{fmt} manifest names attempt {attempt!r:.40} "
                                     "of the other layout")
        elif attempt is not None:
            raise IntegrityError("a format-1 manifest names no attempt")
        raw_files = doc["files"]
        if not isinstance(raw_files, list):
            raise IntegrityError("manifest files must be a list")
        files = []
        for raw in raw_files:
            if not isinstance(raw, dict) or {"path", "size", "crc32c"} - raw.keys():
                raise IntegrityError(f"manifest file entry needs path, size, crc32c: "
                                     f"{_show(raw)}")
            parts = raw.get("part_crc32c")
            files.append(FileEntry(raw["path"], raw["size"], raw["crc32c"], raw.get("part_size"),
                                   tuple(parts) if isinstance(parts, list) else parts))
        extra = doc.get("extra")
        extra = {} if extra is None else extra
        if not isinstance(extra, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in extra.items()
        ):
            raise IntegrityError("manifest extra must map strings to strings")
        for k, v in extra.items():
            (k + v).encode("utf-8")  # a lone surrogate: UnicodeError, made an IntegrityError
        return cls(
            step=doc["step"],
            writer=doc["writer"],
            writers=doc["writers"],
            files=tuple(sorted(files, key=lambda e: e.path)),  # the order to_json writes
            created=doc["created"],
            part_size=doc.get("part_size"),
            attempt=attempt,
            extra=extra,
        )


def _show(raw: object) -> str:
    """A short, printable picture of a bad value (never a huge or nested repr)."""
    try:
        text = repr(raw)
    except (RecursionError, ValueError):
        return f"a {type(raw).__name__}"
    return text[:200].encode("utf-8", "backslashreplace").decode("utf-8")


def check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 10**18:
        raise IntegrityError(f"step must be a whole number in [0, 1e18), got {step!r:.40}")
    return step


def check_consistent(manifests: list[WriterManifest]) -> None:
    """All writers of one step must agree on the step and the writer count,
    and each rank must appear exactly once."""
    if not manifests:
        raise IntegrityError("no manifests")
    step, writers = manifests[0].step, manifests[0].writers
    ranks = sorted(m.writer for m in manifests)
    for m in manifests:
        if m.step != step or m.writers != writers:
            raise IntegrityError(
                f"writer {m.writer} says step {m.step} of {m.writers} writers;"
                f" writer {manifests[0].writer} says step {step} of {writers}"
            )
    if ranks != list(range(writers)):
        raise IntegrityError(f"step {step}: have writers {ranks}, need 0..{writers - 1}")
    # Writers that resumed from different restores (an abandoned run's step
    # committed by some, the new run's by others) are not one checkpoint.
    timelines = {m.extra.get(EXTRA_TIMELINE) for m in manifests} - {None, ""}
    if len(timelines) > 1:
        raise IntegrityError(f"step {step}: its writers saved it in different runs "
                             f"(timelines {', '.join(sorted(timelines))})")


__all__ = [
    "FORMAT_VERSION",
    "FileEntry",
    "IntegrityError",
    "UnsafePath",
    "WriterManifest",
    "check_attempt",
    "check_consistent",
    "check_step",
    "is_spread",
]
