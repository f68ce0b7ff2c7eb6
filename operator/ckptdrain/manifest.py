"""Per-writer checkpoint manifests: what a writer's part of a step holds.

A checkpoint is a step plus `writers` writers (ranks 0..writers-1). Each
writer's manifest lists every file's relative path, size and CRC32C. A
manifest is the commit record: it is written only after every object it
lists is durable, and a checkpoint is complete only when all its writers'
manifests exist and agree. Parsing validates everything, since manifests
come back from the network.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from ckptdrain import checksum, paths
from ckptdrain.errors import IntegrityError, UnsafePath

FORMAT_VERSION = 1
#: Upper bound on a manifest we are willing to parse (a million files fits).
MAX_MANIFEST_BYTES = 256 << 20


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    crc32c: str  # 8 lowercase hex digits

    def __post_init__(self) -> None:
        paths.check_relative_path(self.path)
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise IntegrityError(
                f"{self.path}: size must be a whole number >= 0, got {self.size!r}"
            )
        try:
            checksum.from_hex(self.crc32c)
        except ValueError as err:
            raise IntegrityError(f"{self.path}: {err}") from None


@dataclass(frozen=True)
class WriterManifest:
    step: int
    writer: int
    writers: int
    files: tuple[FileEntry, ...]
    created: float  # Unix seconds, from the writer's clock
    #: Part size the data objects were uploaded with; restore aligns ranged reads to it.
    part_size: int | None = None
    format: int = FORMAT_VERSION
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_step(self.step)
        for name in ("writer", "writers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise IntegrityError(f"manifest {name} must be a whole number, got {value!r}")
        if not 0 <= self.writer < self.writers:
            raise IntegrityError(
                f"manifest writer {self.writer} outside 0..{self.writers - 1}"
                f" (writers={self.writers})"
            )
        if not isinstance(self.created, int | float) or not math.isfinite(self.created):
            raise IntegrityError(f"manifest created must be a finite number, got {self.created!r}")
        if self.format != FORMAT_VERSION:
            raise IntegrityError(
                f"manifest format {self.format!r} not supported (want {FORMAT_VERSION})"
            )
        if self.part_size is not None and (
            isinstance(self.part_size, bool) or not isinstance(self.part_size, int)
            or self.part_size <= 0
        ):
            raise IntegrityError(
                f"manifest part_size must be a positive whole number, got {self.part_size!r}"
            )
        paths.check_path_set(f.path for f in self.files)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> bytes:
        """Deterministic JSON (sorted keys, files sorted by path)."""
        doc = {
            "format": self.format,
            "step": self.step,
            "writer": self.writer,
            "writers": self.writers,
            "created": self.created,
            "part_size": self.part_size,
            "files": [
                {"path": f.path, "size": f.size, "crc32c": f.crc32c}
                for f in sorted(self.files, key=lambda e: e.path)
            ],
            "extra": dict(self.extra),
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> WriterManifest:
        """Parse and validate; raise IntegrityError (or UnsafePath) on anything off."""
        if len(data) > MAX_MANIFEST_BYTES:
            raise IntegrityError(f"manifest larger than {MAX_MANIFEST_BYTES} bytes")
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise IntegrityError(f"manifest is not valid JSON: {err}") from None
        if not isinstance(doc, dict):
            raise IntegrityError("manifest must be a JSON object")
        missing = {"format", "step", "writer", "writers", "created", "files"} - doc.keys()
        if missing:
            raise IntegrityError(f"manifest lacks {', '.join(sorted(missing))}")
        raw_files = doc["files"]
        if not isinstance(raw_files, list):
            raise IntegrityError("manifest files must be a list")
        files = []
        for raw in raw_files:
            if not isinstance(raw, dict) or {"path", "size", "crc32c"} - raw.keys():
                raise IntegrityError(f"manifest file entry needs path, size, crc32c: {raw!r:.200}")
            files.append(FileEntry(raw["path"], raw["size"], raw["crc32c"]))
        extra = doc.get("extra") or {}
        if not isinstance(extra, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in extra.items()
        ):
            raise IntegrityError("manifest extra must map strings to strings")
        return cls(
            step=doc["step"],
            writer=doc["writer"],
            writers=doc["writers"],
            files=tuple(files),
            created=doc["created"],
            part_size=doc.get("part_size"),
            format=doc["format"],
            extra=extra,
        )


def check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 10**18:
        raise IntegrityError(f"step must be a whole number in [0, 1e18), got {step!r}")
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


__all__ = [
    "FORMAT_VERSION",
    "FileEntry",
    "IntegrityError",
    "UnsafePath",
    "WriterManifest",
    "check_consistent",
    "check_step",
]
