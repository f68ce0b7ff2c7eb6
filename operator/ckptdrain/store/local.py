"""The file:// store: objects are files under a root directory.

Layout under the root:
    <key>                              one file per object, '/' -> subdirectory
    <dir>/.ckptdrain-tmp-<random>      a put in progress (renamed into place)
    .ckptdrain-multipart/<id>/         an unfinished multipart upload:
        key                            the object key it is for
        00001.part, 00001.etag         part data, then its etag and size
    .ckptdrain-multipart/trash-<id>-*  an upload being removed (completed or
                                       aborted): renamed first, so a kill
                                       mid-removal leaves nothing half alive

Every name starting with `.ckptdrain-` is reserved: keys may not use it and
`list()` never shows it. Multipart state lives on disk, so an upload survives
the death of the process that started it.

A killed process can leave temp files, trash and uploads whose `key` was
never written; `sweep` (store/local_sweep.py) removes them once older than a
grace period, and drains call it when they start.

Unlike S3, a key cannot be both an object and a "directory" of other keys
('a' and 'a/b'); such a put raises StoreError.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from ckptdrain import checksum
from ckptdrain.errors import (
    IntegrityError,
    InvalidInput,
    ObjectMissing,
    ObjectTooLarge,
    StoreError,
)
from ckptdrain.localfs import fsync_dir as _fsync_dir
from ckptdrain.paths import RESERVED_PREFIX, check_key
from ckptdrain.store import local_sweep
from ckptdrain.store.base import MultipartUpload, ObjectInfo, UploadedPart

_TMP_PREFIX = RESERVED_PREFIX + "tmp-"
_MULTIPART_DIR = RESERVED_PREFIX + "multipart"
_UPLOAD_ID_RE = re.compile(r"[0-9a-f]{32}")
MAX_PART_NUMBER = 10_000  # as on S3
_COPY_CHUNK = 1 << 20


def _refused(key: str, number: int, actual: int, expected: int) -> IntegrityError:
    return IntegrityError(
        f"upload_part {key} part {number}: the store refused the bytes: checksum "
        f"mismatch (CRC32C {checksum.to_hex(actual)}, expected {checksum.to_hex(expected)})")


class LocalStore:
    """A Store over a directory. Thread-safe: every change is a rename.

    `min_part_size` defaults to 1 byte: the filesystem needs no minimum. Pass
    5 MiB to make complete_multipart refuse small parts the way S3 does.
    """

    def __init__(self, root: str | os.PathLike[str], *, min_part_size: int = 1) -> None:
        root_path = Path(root)
        if not root_path.is_absolute():
            raise InvalidInput("uri", "an absolute directory path", str(root))
        if min_part_size < 1:
            raise InvalidInput("min_part_size", "at least 1 byte", min_part_size)
        try:
            root_path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StoreError(f"cannot create store directory {root_path}: {err.strerror}") from err
        self.root = root_path.resolve()
        self.uri = "file://" + str(self.root)
        self._min_part_size = min_part_size

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    @property
    def min_part_size(self) -> int:
        return self._min_part_size

    # Paths -----------------------------------------------------------------
    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def _upload_dir(self, key: str, upload_id: str) -> Path | None:
        """The directory of a live upload for `key`, or None if there is none."""
        check_key(key)
        # The id comes back from callers (journals, the network): only ids we
        # could have made may become a path.
        if not isinstance(upload_id, str) or not _UPLOAD_ID_RE.fullmatch(upload_id):
            return None
        path = self.root / _MULTIPART_DIR / upload_id
        try:
            recorded = (path / "key").read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return None
        return path if recorded == key else None

    # Writing ---------------------------------------------------------------
    def _write_atomic(
        self, target: Path, chunks: Iterator[bytes | memoryview], *, make_parents: bool = True
    ) -> None:
        """Write chunks to a temp file beside `target`, fsync, rename, fsync dir.

        Without `make_parents`, a missing parent raises FileNotFoundError
        (an upload directory that was aborted must not come back).
        """
        # A concurrent delete may prune the parent directory between mkdir and
        # open; retrying the mkdir is enough.
        for attempt in range(5):
            try:
                if make_parents:
                    target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.parent / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileNotFoundError:
                if attempt == 4 or not make_parents:
                    raise
            except (FileExistsError, NotADirectoryError) as err:
                raise StoreError(
                    f"cannot write {target}: a parent of the key is itself an object"
                ) from err
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.rename(tmp, target)
        except IsADirectoryError as err:
            raise StoreError(f"cannot write {target}: other keys live under it") from err
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _fsync_dir(target.parent)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write_atomic(self._path(key), iter((data,)))

    def put_stream(self, key: str, stream: BinaryIO, size: int) -> None:
        """Copy exactly `size` bytes; a stream that ends early raises IntegrityError."""
        if size < 0:
            raise InvalidInput("size", "a size >= 0", size)

        def chunks() -> Iterator[bytes]:
            left = size
            while left:
                chunk = stream.read(min(left, _COPY_CHUNK))
                if not chunk:
                    raise IntegrityError(
                        f"stream for {key} ended after {size - left} of {size} bytes"
                    )
                left -= len(chunk)
                yield chunk

        self._write_atomic(self._path(key), chunks())

    # Reading ---------------------------------------------------------------
    def get_bytes(self, key: str, *, limit: int | None = None) -> bytes:
        try:
            with self._path(key).open("rb") as f:
                if limit is None:
                    return f.read()
                # The file's size first (a sparse multi-GB file costs no
                # disk); then one byte more than it, should it have grown
                # since: read(n) allocates n bytes whatever the file holds.
                size = os.fstat(f.fileno()).st_size
                if size > limit:
                    raise ObjectTooLarge(f"{key}: {size} bytes, more than the {limit} allowed")
                data = f.read(size + 1)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as err:
            raise ObjectMissing(key) from err
        if len(data) > size:  # written in place meanwhile: not one object's bytes
            raise IntegrityError(f"{key}: grew while it was read")
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Up to `length` bytes from `start`; fewer only where the object ends."""
        if start < 0 or length < 0:
            raise InvalidInput("range", "start >= 0 and length >= 0", (start, length))
        try:
            with self._path(key).open("rb") as f:
                f.seek(start)
                return f.read(length)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as err:
            raise ObjectMissing(key) from err

    def get_range_into(self, key: str, start: int, buffer: memoryview) -> int:
        """Read up to len(buffer) bytes from `start` into `buffer` (preadv, no
        copy); return how many, fewer only where the object ends."""
        if start < 0:
            raise InvalidInput("range", "start >= 0", start)
        view = memoryview(buffer).cast("B")
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as err:
            raise ObjectMissing(key) from err
        try:
            got = 0
            while got < len(view):
                n = os.preadv(fd, [view[got:]], start + got)
                if n == 0:
                    break
                got += n
            return got
        except IsADirectoryError as err:
            raise ObjectMissing(key) from err
        finally:
            os.close(fd)

    def head(self, key: str) -> ObjectInfo | None:
        try:
            st = self._path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(st.st_mode):
            return None  # 'a' when only 'a/b' exists
        return ObjectInfo(key=key, size=st.st_size)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Objects under `prefix`, sorted by UTF-8 bytes as S3 sorts them."""
        # Walk only the deepest directory the prefix names; filter the rest.
        base_dir = prefix.rpartition("/")[0]
        start = self.root.joinpath(*base_dir.split("/")) if base_dir else self.root
        if base_dir and any(p in ("", ".", "..") for p in base_dir.split("/")):
            return iter(())  # no safe key can start with such a prefix
        found: list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if not d.startswith(RESERVED_PREFIX)]
            rel = os.path.relpath(dirpath, self.root)
            for name in filenames:
                if name.startswith(RESERVED_PREFIX):
                    continue
                key = name if rel == "." else f"{rel}/{name}".replace(os.sep, "/")
                if not key.startswith(prefix):
                    continue
                with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                    st = os.stat(os.path.join(dirpath, name))
                    found.append(ObjectInfo(key, st.st_size, st.st_mtime))
        found.sort(key=lambda info: info.key.encode("utf-8"))
        return iter(found)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            return
        except IsADirectoryError:
            return  # 'a' when only 'a/b' exists: there is no object 'a'
        _fsync_dir(path.parent)
        # Prune now-empty parents so 'a' can later be an object again.
        parent = path.parent
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    # Multipart -------------------------------------------------------------
    def create_multipart(self, key: str) -> str:
        check_key(key)
        upload_id = uuid.uuid4().hex
        path = self.root / _MULTIPART_DIR / upload_id
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
                chunk = stream.read(min(left, _COPY_CHUNK))
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
                    while chunk := f.read(_COPY_CHUNK):
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
        for upload_id, path in local_sweep.upload_dirs(self.root / _MULTIPART_DIR):
            try:
                key = (path / "key").read_text(encoding="utf-8")
                initiated = (path / "key").stat().st_mtime
            except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
                continue  # half made or half removed: sweep's business
            if key.startswith(prefix):
                found.append(MultipartUpload(key, upload_id, initiated))
        found.sort(key=lambda u: (u.key.encode("utf-8"), u.upload_id))
        return found

    def sweep(self, older_than: float, now: float | None = None,
              prefixes: tuple[str, ...] = ("",)) -> int:
        """Remove what killed writers left behind, older than `older_than`
        seconds: temp files (beside keys under `prefixes`), half-removed and
        half-made uploads. Returns how many were removed. Uploads with a key
        stay: whoever owns them aborts them."""
        dirs = tuple(self.root.joinpath(*p.rpartition("/")[0].split("/"))
                     if "/" in p else self.root for p in prefixes)
        for prefix in prefixes:
            check_key(prefix + "x")  # a prefix no key could start with walks nothing
        return local_sweep.sweep(self.root, self.root / _MULTIPART_DIR, older_than, now, dirs)

    def object_crc32c(self, key: str) -> str | None:
        """The object's CRC32C, computed from the file (None if it is missing)."""
        try:
            _, crc = checksum.crc32c_file(self._path(key))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        return checksum.to_hex(crc)
