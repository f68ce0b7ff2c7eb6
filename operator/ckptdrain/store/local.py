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
the death of the process that started it (store/local_multipart.py).

A killed process can leave temp files, trash and uploads whose `key` was
never written; `sweep` (store/local_sweep.py) removes them once older than a
grace period, and drains call it when they start.

Unlike S3, a key cannot be both an object and a "directory" of other keys
('a' and 'a/b'); such a put raises StoreError.
"""

from __future__ import annotations

import contextlib
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ckptdrain import checksum
from ckptdrain.errors import (
    BucketMissing,
    IntegrityError,
    InvalidInput,
    ObjectMissing,
    ObjectTooLarge,
    StoreError,
)
from ckptdrain.localfs import fsync_dir as _fsync_dir
from ckptdrain.paths import RESERVED_PREFIX, check_key
from ckptdrain.store import local_sweep
from ckptdrain.store.base import ObjectInfo
from ckptdrain.store.local_multipart import COPY_CHUNK as _COPY_CHUNK
from ckptdrain.store.local_multipart import MULTIPART_DIR as _MULTIPART_DIR
from ckptdrain.store.local_multipart import LocalMultipart

_TMP_PREFIX = RESERVED_PREFIX + "tmp-"


class LocalStore(LocalMultipart):
    """A Store over a directory. Thread-safe: every change is a rename.

    `min_part_size` defaults to 1 byte: the filesystem needs no minimum. Pass
    5 MiB to make complete_multipart refuse small parts the way S3 does.
    `create` False refuses a root that is not an existing directory
    (BucketMissing) instead of creating it.
    """

    def __init__(self, root: str | os.PathLike[str], *, min_part_size: int = 1,
                 create: bool = True) -> None:
        root_path = Path(root)
        if not root_path.is_absolute():
            raise InvalidInput("uri", "an absolute directory path", str(root))
        if min_part_size < 1:
            raise InvalidInput("min_part_size", "at least 1 byte", min_part_size)
        if not create and not root_path.is_dir():
            # A mistyped path must not read as an empty store (or become one).
            what = "is not a directory" if root_path.exists() else "does not exist"
            raise BucketMissing(f"store directory {root_path} {what}")
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

    def put_bytes(self, key: str, data: bytes, crc32c: int | None = None) -> None:
        if crc32c is not None:
            actual = checksum.crc32c(memoryview(data).cast("B"))
            if actual != crc32c:
                raise IntegrityError(
                    f"put_bytes {key}: the store refused the bytes: checksum mismatch "
                    f"(CRC32C {checksum.to_hex(actual)}, expected {checksum.to_hex(crc32c)})")
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
