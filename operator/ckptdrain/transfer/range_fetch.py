"""One range of a restored file: from the store into its staging file, and
the range's CRC32C, taken from what the file was given.

How depends on the store: one that writes bodies into files itself (a plain
HTTP endpoint splices them, store/splice.py) is handed the file; otherwise
the body is read into the worker's buffer, its CRC taken there, and the
buffer written at the range's offset.
"""

from __future__ import annotations

import os
from pathlib import Path

from ckptdrain import checksum
from ckptdrain.errors import IntegrityError
from ckptdrain.localfs import pwrite_all
from ckptdrain.store.base import Store

#: Largest ranged GET into a file, for a store that splices its bodies into
#: files (store/splice.py): no buffer to size, so a range may be a whole
#: 64 MiB part; the store spends less CPU per GB on fewer, larger requests.
MAX_FILE_RANGE = 64 << 20
#: Read-back buffer for the CRC of a range written by the store.
CRC_READ = 1 << 20


def offers(store: Store, method: str) -> bool:
    # Looked up on the class: a wrapper that forwards unknown attributes
    # (fault injection in the tests) keeps its own reads.
    return callable(getattr(type(store), method, None))


def to_file(store: Store) -> bool:
    """Whether ranges go from the store straight into the file (spliced)."""
    return offers(store, "get_range_to_file") and getattr(store, "splices", False) is True


def worker_buffer(store: Store, biggest: int) -> memoryview | None:
    """The buffer one worker reuses for every range: the largest range and
    one byte more (the last range asks for it) where the store reads into a
    buffer; a small one where it writes into the file, for the read-back."""
    if to_file(store):
        return memoryview(bytearray(CRC_READ))
    return memoryview(bytearray(biggest + 1)) if offers(store, "get_range_into") else None


def fetch_range(store: Store, key: str, target: Path, size: int, offset: int, length: int,
                buffer: memoryview | None) -> int:
    """Bytes `offset`..+`length` of `key` (an object of `size` bytes by its
    manifest) written into `target` at the same offset; their CRC32C.
    IntegrityError when the object is longer or shorter than `size`."""
    last = offset + length == size
    # One byte more on the last range reveals an object longer than the manifest says.
    want = length + 1 if last else length
    if to_file(store):
        assert buffer is not None
        return _fetch_range_to_file(store, key, target, size, offset, length, want, buffer)
    data: bytes | memoryview
    if buffer is not None:
        got = store.get_range_into(key, offset, buffer[:want])  # type: ignore[attr-defined]
        data = buffer[:got]
    else:
        data = store.get_range(key, offset, want)
    _check_length(key, size, len(data), length)
    crc = checksum.crc32c(data)
    fd = os.open(target, os.O_WRONLY)
    try:
        pwrite_all(fd, data, offset)
    finally:
        os.close(fd)
    return crc


def _check_length(key: str, size: int, got: int, length: int) -> None:
    if got != length:
        raise IntegrityError(f"{key}: {'longer' if got > length else 'shorter'} than "
                             f"the manifest's {size} bytes")


def _fetch_range_to_file(store: Store, key: str, target: Path, size: int, offset: int,
                         length: int, want: int, buffer: memoryview) -> int:
    """The range written into the file by the store; its CRC32C read back from
    the page cache, so what is verified is what the file holds. (A longer
    object's extra byte on the last range grows the staging file by one:
    the IntegrityError that follows discards it with the candidate.)"""
    fd = os.open(target, os.O_RDWR)
    try:
        got = store.get_range_to_file(key, offset, want, fd, offset)  # type: ignore[attr-defined]
        _check_length(key, size, got, length)
        return checksum.crc32c_range(fd, offset, length, buffer)
    finally:
        os.close(fd)
