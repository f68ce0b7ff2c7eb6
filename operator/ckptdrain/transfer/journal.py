"""The resumable upload journal: what a drain has already made durable.

It lives on local disk beside the checkpoint and records the attempt id (the
data prefix this drain writes under, kept so a resume continues the same
attempt) and, per file, the
multipart upload id, the part size, every finished part (number, ETag,
CRC32C, size) and whether the file's object is complete (with its parts'
CRC32Cs, which the committed manifest lists), plus whether the
writer's manifest (the commit record) is written. A drain killed at any point
resumes from it without re-sending a finished part.

`UploadJournal` holds the pure state transitions; `load` and `save` are the
thin I/O (save is atomic: temp file, fsync, rename, fsync of the directory,
so a crash leaves the old journal or the new one, never half of either).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ckptdrain import keys
from ckptdrain.errors import IntegrityError
from ckptdrain.localfs import fsync_dir
from ckptdrain.manifest import check_attempt

#: 2: with the attempt id. A format-1 journal is not resumed (its keys are of
#: the layout without attempts); the drain starts a fresh attempt.
JOURNAL_FORMAT = 2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartRecord:
    number: int
    etag: str
    crc32c: int
    size: int


@dataclass
class FileState:
    """Upload state of one file (one data object)."""

    key: str
    size: int
    part_size: int
    upload_id: str | None = None
    parts: dict[int, PartRecord] = field(default_factory=dict)
    complete: bool = False
    #: Once complete: the CRC32C of each part of its object, in order (None
    #: when unknown, e.g. a journal written before they were kept).
    part_crcs: list[int] | None = None

    @property
    def done_bytes(self) -> int:
        return self.size if self.complete else sum(p.size for p in self.parts.values())


@dataclass
class UploadJournal:
    """Drain progress of one writer's part of one step, to one store."""

    store_uri: str
    step: int
    writer: int
    #: CRC32C of the manifest without its creation time: reused only for the same files.
    manifest_id: str
    #: Where this drain's data goes (keys.data_prefix): one attempt per journal.
    attempt: str = field(default_factory=keys.new_attempt)
    files: dict[str, FileState] = field(default_factory=dict)
    manifest_written: bool = False

    def matches(self, store_uri: str, step: int, writer: int, manifest_id: str) -> bool:
        return (self.store_uri, self.step, self.writer, self.manifest_id) == (
            store_uri, step, writer, manifest_id)

    # -- state transitions -------------------------------------------------
    def file(self, path: str, key: str, size: int, part_size: int) -> FileState:
        """The state of `path`, restarted if its key, size or part size changed."""
        state = self.files.get(path)
        if state is None or (state.key, state.size, state.part_size) != (key, size, part_size):
            state = FileState(key=key, size=size, part_size=part_size)
            self.files[path] = state
        return state

    def upload_started(self, path: str, upload_id: str) -> None:
        state = self.files[path]
        state.upload_id, state.parts, state.complete = upload_id, {}, False

    def part_done(self, path: str, part: PartRecord) -> None:
        self.files[path].parts[part.number] = part

    def keep_parts(self, path: str, numbers_with_etags: dict[int, str]) -> None:
        """Forget journaled parts the store no longer holds (or holds differently)."""
        state = self.files[path]
        state.parts = {
            n: p for n, p in state.parts.items()
            if _etag(numbers_with_etags.get(n, "")) == _etag(p.etag)
        }

    def upload_lost(self, path: str) -> None:
        """The store forgot the upload: the file starts over."""
        state = self.files[path]
        state.upload_id, state.parts, state.complete = None, {}, False

    def file_complete(self, path: str, part_crcs: list[int] | None = None) -> None:
        """`path`'s object is complete; its parts' CRC32Cs are `part_crcs`, or
        those of the journaled parts when they are all there (numbered 1..n)."""
        state = self.files[path]
        if part_crcs is None and state.parts and sorted(state.parts) == list(
                range(1, len(state.parts) + 1)):
            part_crcs = [state.parts[n].crc32c for n in sorted(state.parts)]
        state.complete, state.upload_id, state.parts = True, None, {}
        state.part_crcs = part_crcs

    def file_incomplete(self, path: str) -> None:
        self.files[path].complete = False
        self.files[path].part_crcs = None

    def manifest_done(self) -> None:
        self.manifest_written = True

    def open_uploads(self) -> list[tuple[str, str]]:
        """(key, upload id) of every multipart upload still open."""
        return [(s.key, s.upload_id) for s in self.files.values()
                if s.upload_id is not None and not s.complete]

    @property
    def done_bytes(self) -> int:
        return sum(s.done_bytes for s in self.files.values())

    # -- (de)serialisation -------------------------------------------------
    def to_json(self) -> bytes:
        doc = {
            "format": JOURNAL_FORMAT,
            "store_uri": self.store_uri,
            "step": self.step,
            "writer": self.writer,
            "manifest_id": self.manifest_id,
            "attempt": self.attempt,
            "manifest_written": self.manifest_written,
            "files": {
                path: {
                    "key": s.key, "size": s.size, "part_size": s.part_size,
                    "upload_id": s.upload_id, "complete": s.complete,
                    "parts": [[p.number, p.etag, p.crc32c, p.size]
                              for p in sorted(s.parts.values(), key=lambda p: p.number)],
                    "part_crcs": s.part_crcs,
                }
                for path, s in sorted(self.files.items())
            },
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> UploadJournal:
        try:
            doc = json.loads(data)
            if doc["format"] != JOURNAL_FORMAT:
                raise ValueError(f"format {doc['format']!r}")
            journal = cls(doc["store_uri"], int(doc["step"]), int(doc["writer"]),
                          doc["manifest_id"], attempt=check_attempt(doc["attempt"]),
                          manifest_written=bool(doc["manifest_written"]))
            for path, raw in doc["files"].items():
                journal.files[path] = FileState(
                    key=raw["key"], size=int(raw["size"]), part_size=int(raw["part_size"]),
                    upload_id=raw["upload_id"], complete=bool(raw["complete"]),
                    parts={int(n): PartRecord(int(n), str(e), int(c), int(s))
                           for n, e, c, s in raw["parts"]},
                    part_crcs=_crcs(raw.get("part_crcs")),
                )
        except Exception as err:
            # Any shape of damage (AttributeError, OverflowError, RecursionError,
            # ...) is the same unreadable journal: the drain starts afresh.
            raise IntegrityError(
                f"upload journal unreadable: {type(err).__name__}: {str(err)[:120]}") from None
        return journal


def _crcs(raw: object) -> list[int] | None:
    if raw is None:  # a journal from before part CRC32Cs were kept
        return None
    if not isinstance(raw, list):
        raise ValueError(f"part_crcs must be a list, got {type(raw).__name__}")
    # Each becomes a manifest entry at the commit: one no CRC32C can be would
    # fail every commit of the step instead of starting the drain afresh.
    if not all(type(c) is int and 0 <= c <= 0xFFFFFFFF for c in raw):
        raise ValueError("part_crcs must be CRC32Cs (whole numbers below 2**32)")
    return list(raw)


def _etag(etag: str) -> str:
    return etag.strip('"')


def load(path: Path) -> UploadJournal | None:
    """The journal at `path`, or None if there is none (or it is unreadable,
    in which case the drain simply starts over)."""
    try:
        return UploadJournal.from_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (IntegrityError, OSError) as err:
        log.warning("%s: %s; starting a fresh attempt", path, str(err)[:200])
        return None


def save(path: Path, journal: UploadJournal) -> None:
    """Replace the journal atomically and durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(journal.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
