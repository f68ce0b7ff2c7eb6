"""The file:// store's multipart uploads: parts as files in an upload directory.

An upload lives on disk (`.ckptdrain-multipart/<id>/`, see local.py), so it
survives the process that started it. Parts are checked against their
CRC32C as S3 servers check them; each part's etag is written after its data,
so a part without one is not listed (and is sent again).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ckptdrain import checksum
from ckptdrain.errors import IntegrityError, InvalidInput, ObjectMissing
from ckptdrain.paths import RESERVED_PREFIX, check_key
from ckptdrain.store import local_sweep
from ckptdrain.store.base import MultipartUpload, UploadedPart

MULTIPART_DIR = RESERVED_PREFIX + "multipart"
_UPLOAD_ID_RE = re.compile(r"[0-9a-f]{32}")
MAX_PART_NUMBER = 10_000  # as on S3
COPY_CHUNK = 1 << 20


def _refused(key: str, number: int, actual: int, expected: int) -> IntegrityError:
    return IntegrityError(
        f"upload_part {key} part {number}: the store refused the bytes: checksum "
        f"mismatch (CRC32C {checksum.to_hex(actual)}, expected {checksum.to_hex(expected)})")



class LocalMultipart:
    """LocalStore's multipart operations (the Store protocol's upload half)."""

    root: Path
    _min_part_size: int

    if TYPE_CHECKING:  # LocalStore's own helpers
        def _path(self, key: str) -> Path: ...
        def _write_atomic(self, target: Path, chunks: Iterator[bytes | memoryview], *,
                          make_parents: bool = True) -> None: ...

    def _upload_dir(self, key: str, upload_id: str) -> Path | None:
        """The directory of a live upload for `key`, or None if there is none."""
        check_key(key)
        # The id comes back from callers (journals, the network): only ids we
        # could have made may become a path.
        if not isinstance(upload_id, str) or not _UPLOAD_ID_RE.fullmatch(upload_id):
            return None
        path = self.root / MULTIPART_DIR / upload_id
        try:
            recorded = (path / "key").read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return None
        return path if recorded == key else None


    def create_multipart(self, key: str) -> str:
        check_key(key)
        upload_id = uuid.uuid4().hex
        path = self.root / MULTIPART_DIR / upload_id
        path.mkdir(parents=True)
        self._write_atomic(path / "key", iter((key.encode("utf-8"),)))
        return upload_id

    def upload_part(
        self, key: str, upload_id: str, number: int, data: bytes, crc32c: int | None = None
    ) -> UploadedPart:
        """Store one part durably. Raises ObjectMissing if the upload is gone,
        IntegrityError if `crc32c` is given and is not the CRC32C of `data`
        (checked as S3 servers do; awscrt makes it cheap)."""
        actual = checksum.crc32c(memoryview(data).cast("B"))
        if crc32c is not None and crc32c != actual:
            raise _refused(key, number, actual, crc32c)
        etag = f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'
        self._store_part(key, upload_id, number, iter((data,)), len(data), lambda: etag)
        return UploadedPart(number=number, etag=etag, crc32c=actual)

    def upload_part_from(self, key: str, upload_id: str, number: int, stream: BinaryIO,
                         size: int, crc32c: int) -> UploadedPart:
        """upload_part from a stream, in 1 MiB chunks; the CRC32C is checked
        once the chunks are written, before the part file takes its name."""
        md5 = hashlib.md5(usedforsecurity=False)

        def chunks() -> Iterator[bytes]:
            crc, left = 0, size
            while left:
                chunk = stream.read(min(left, COPY_CHUNK))
                if not chunk:
                    raise IntegrityError(f"upload_part {key} part {number}: the stream ended "
                                         f"{left} bytes early")
                crc, left = checksum.crc32c(chunk, crc), left - len(chunk)
                md5.update(chunk)
                yield chunk
            if crc != crc32c:  # raised inside the write: the temp file goes
                raise _refused(key, number, crc, crc32c)

        self._store_part(key, upload_id, number, chunks(), size, lambda: f'"{md5.hexdigest()}"')
        return UploadedPart(number=number, etag=f'"{md5.hexdigest()}"', crc32c=crc32c)

    def _store_part(self, key: str, upload_id: str, number: int, chunks: Iterator[bytes],
                    size: int, etag: Callable[[], str]) -> None:
        """Write a part's chunks, then its etag (known once they are written)."""
        if not 1 <= number <= MAX_PART_NUMBER:
            raise InvalidInput("part number", f"1..{MAX_PART_NUMBER}", number)
        path = self._upload_dir(key, upload_id)
        if path is None:
            raise ObjectMissing(key)
        etag_file = path / f"{number:05d}.etag"
        # Drop the old etag first: a crash between the two writes leaves a
        # part without an etag, which list_parts does not report (re-sent).
        with contextlib.suppress(FileNotFoundError):
            etag_file.unlink()
        try:
            self._write_atomic(path / f"{number:05d}.part", chunks, make_parents=False)
            self._write_atomic(etag_file, iter((f"{etag()} {size}".encode(),)),
                               make_parents=False)
        except FileNotFoundError as err:  # aborted meanwhile
            raise ObjectMissing(key) from err

    def _parts(self, path: Path) -> dict[int, tuple[str, int, float]]:
        """number -> (etag, size, mtime) of the parts complete on disk."""
        parts: dict[int, tuple[str, int, float]] = {}
        for entry in os.scandir(path):
            name = entry.name
            if not name.endswith(".etag") or not name[:5].isdigit():
                continue
            etag, _, size_text = Path(entry.path).read_text().partition(" ")
            part_file = path / f"{name[:5]}.part"
            with contextlib.suppress(FileNotFoundError):
                st = part_file.stat()
                if st.st_size == int(size_text):
                    parts[int(name[:5])] = (etag, int(size_text), st.st_mtime)
        return parts

    def list_parts(self, key: str, upload_id: str) -> list[UploadedPart] | None:
        path = self._upload_dir(key, upload_id)
        if path is None:
            return None
        try:
            parts = self._parts(path)
        except FileNotFoundError:
            return None  # aborted while we looked
        return [UploadedPart(n, etag, modified=mtime)
                for n, (etag, _, mtime) in sorted(parts.items())]

    def complete_multipart(self, key: str, upload_id: str, parts: list[UploadedPart]) -> None:
        """Assemble `parts` in order into the object, atomically.

        Raises ObjectMissing if the upload is gone, IntegrityError if a part
        is missing, its etag differs, or the list is empty or out of order.
        """
        path = self._upload_dir(key, upload_id)
        if path is None:
            raise ObjectMissing(key)
        if not parts:
            raise IntegrityError(f"multipart upload for {key}: no parts to complete")
        held = self._parts(path)
        numbers = [p.number for p in parts]
        if numbers != sorted(set(numbers)):
            raise IntegrityError(f"multipart upload for {key}: parts not in ascending order")
        for i, part in enumerate(parts):
            if part.number not in held or held[part.number][0] != part.etag:
                raise IntegrityError(
                    f"multipart upload for {key}: part {part.number} missing or its etag differs"
                )
            if i < len(parts) - 1 and held[part.number][1] < self._min_part_size:
                raise IntegrityError(
                    f"multipart upload for {key}: part {part.number} is smaller than "
                    f"min_part_size {self._min_part_size}"
                )

        def chunks() -> Iterator[bytes]:
            for part in parts:
                with (path / f"{part.number:05d}.part").open("rb") as f:
                    while chunk := f.read(COPY_CHUNK):
                        yield chunk

        self._write_atomic(self._path(key), chunks())
        local_sweep.discard_upload(path)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        path = self._upload_dir(key, upload_id)
        if path is not None:
            local_sweep.discard_upload(path)

    def list_multipart_uploads(self, prefix: str) -> list[MultipartUpload]:
        """Unfinished uploads for keys under `prefix`; initiated = when `key` was written."""
        found = []
        for upload_id, path in local_sweep.upload_dirs(self.root / MULTIPART_DIR):
            try:
                key = (path / "key").read_text(encoding="utf-8")
                initiated = (path / "key").stat().st_mtime
            except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
                continue  # half made or half removed: sweep's business
            if key.startswith(prefix):
                found.append(MultipartUpload(key, upload_id, initiated))
        found.sort(key=lambda u: (u.key.encode("utf-8"), u.upload_id))
        return found
