"""The store protocol: the few operations checkpoints need from object storage.

Both the local-filesystem and the S3 adapters implement it; fault-injecting
wrappers in the tests wrap a real one. Keys are '/'-separated strings relative
to the store's root (the URI's prefix); adapters never interpret them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol, runtime_checkable


class SendStopped(Exception):
    """Raised by a store's pacer (`set_pacer`) to abandon a request while its
    body is being sent: the sender is stopping (a cancelled or superseded
    drain). It says nothing of the store: the store raises it unchanged,
    neither retried nor counted as congestion."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    #: Last change, Unix seconds, where the store says (listings do; head may
    #: not). Retention's grace period reads it; not part of identity.
    modified: float | None = field(default=None, compare=False)
    #: The storage class a listing reports (S3: STANDARD, STANDARD_IA, ...;
    #: None where the store has none). Cold storage reads it.
    storage_class: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class MultipartUpload:
    """An unfinished multipart upload, as the store lists it."""

    key: str
    upload_id: str
    initiated: float | None = None  # Unix seconds, when the store says


@dataclass(frozen=True)
class UploadedPart:
    number: int  # 1-based, as S3 numbers them
    etag: str
    # The part's CRC32C, when known. S3 needs it again to complete an upload
    # whose parts were sent with one; not part of a part's identity (SeaweedFS
    # lists parts without it), so it does not take part in ==.
    crc32c: int | None = field(default=None, compare=False)
    #: When the store received it, Unix seconds, where list_parts says (S3's
    #: LastModified, a part file's mtime). Retention judges an unfinished
    #: upload by its newest part: one still being sent is not abandoned.
    modified: float | None = field(default=None, compare=False)


@runtime_checkable
class Store(Protocol):
    """What every store offers. All methods are thread-safe."""

    uri: str

    # Whole objects -----------------------------------------------------
    def put_bytes(self, key: str, data: bytes, crc32c: int | None = None) -> None:
        """Write a small object atomically (readers see all of it or nothing).

        `crc32c`, the caller's CRC32C of `data`, is verified by the store
        (IntegrityError on a mismatch); the store computes it when not given."""

    def put_stream(self, key: str, stream: BinaryIO, size: int) -> None:
        """Write an object of known size from a stream, atomically."""

    def get_bytes(self, key: str, *, limit: int | None = None) -> bytes:
        """Read a whole (small) object. Raises ObjectMissing.

        With `limit`, an object larger than `limit` bytes raises ObjectTooLarge
        without being read: its size is checked first, and no more than
        limit + 1 bytes are ever read, whatever size the store claimed."""

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Read `length` bytes from `start`. Raises ObjectMissing.

        Never more than `length` bytes: a server that ignores the range
        (answers the whole object) or answers another one raises StoreError
        before its body is read."""

    # Optional: get_range_into(key, start, buffer: memoryview) -> int reads up
    # to len(buffer) bytes into the caller's buffer and returns how many (as
    # get_range, without making a bytes). The restore engine uses it when a
    # store has it (not part of the protocol: wrappers need not offer it).

    def head(self, key: str) -> ObjectInfo | None:
        """Size of an object, or None when it does not exist."""

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Objects whose key starts with `prefix`, in key order."""

    def delete(self, key: str) -> None:
        """Remove an object; removing a missing one is not an error."""

    # Multipart uploads (resumable: ids and parts survive the process) ----
    def create_multipart(self, key: str) -> str:
        """Start a multipart upload, returning its upload id."""

    def upload_part(
        self, key: str, upload_id: str, number: int, data: bytes, crc32c: int | None = None
    ) -> UploadedPart:
        """Upload one part (all but the last at least `min_part_size`).

        `crc32c`, the caller's CRC32C of `data`, is verified by the store
        (IntegrityError on a mismatch); the store computes it when not given.
        The returned part carries it: complete_multipart needs it back."""

    def upload_part_from(self, key: str, upload_id: str, number: int, stream: BinaryIO,
                         size: int, crc32c: int) -> UploadedPart:
        """upload_part, the part's `size` bytes read from `stream` (seekable,
        from where it stands) as they are sent, never held whole: a part
        larger than the caller's buffer. `crc32c` is required (computed by
        the caller in a pass of its own) and verified as upload_part's; a
        stream that ends early raises IntegrityError."""

    def list_parts(self, key: str, upload_id: str) -> list[UploadedPart] | None:
        """Parts the store holds for an upload, or None if the upload is gone.
        Their crc32c may be None (not every server lists it)."""

    def complete_multipart(self, key: str, upload_id: str, parts: list[UploadedPart]) -> None:
        """Make the object visible, assembled from `parts` in order (each with
        the crc32c it was uploaded with: S3 stores need it)."""

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Drop an unfinished upload and its parts; a missing one is fine."""

    def list_multipart_uploads(self, prefix: str) -> list[MultipartUpload]:
        """Unfinished multipart uploads whose key starts with `prefix`, by key.
        Uploads nobody completes or aborts hold storage for ever: drains abort
        the ones under their own prefix that their journal does not own."""

    # Optional: object_crc32c(key) -> str | None gives the CRC32C the store
    # holds for an object without reading it: 8 hex digits for the whole
    # object, or "<8 hex>-<parts>" (S3's composite checksum of a multipart
    # upload: the CRC32C of the parts' CRC32Cs, big-endian, concatenated);
    # None when the store keeps none. A resumed drain uses it to recognise an
    # object completed before the kill (not part of the protocol).

    @property
    def min_part_size(self) -> int:
        """Smallest size of a non-final part (5 MiB on S3)."""
