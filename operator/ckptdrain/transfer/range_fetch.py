"""One range of a restored file: from the store into its staging file, and
the range's CRC32C, taken from what the file was given.

Three ways, chosen once per restore (`choose`):
- DIRECT, onto a disk: the body is read into the worker's page-aligned
  buffer, its CRC taken there, and the device takes it from the buffer
  (transfer/direct_io.py). A store that can hand a body over a piece at a
  time (get_range_through) reads whole parts through a small buffer.
- SPLICED, into memory (tmpfs) from a plain HTTP endpoint: the store moves
  the body into the file itself (store/splice.py); the CRC is read back.
- BUFFERED, otherwise: read into the worker's buffer, CRC, written.
"""

from __future__ import annotations

import os
from pathlib import Path

from ckptdrain import checksum
from ckptdrain.errors import IntegrityError
from ckptdrain.localfs import pwrite_all
from ckptdrain.store.base import Store
from ckptdrain.transfer import direct_io as direct_io_mod

#: Largest ranged GET into a buffer that holds the whole range: bigger ones
#: cost CPU in buffering for no gain.
MAX_RANGE = 16 << 20
#: Largest ranged GET where no buffer holds a whole range (spliced into the
#: file, or read through a piece at a time): a whole 64 MiB part; the store
#: spends less CPU per GB on fewer, larger requests.
MAX_FILE_RANGE = 64 << 20
#: Read-back buffer for the CRC of a range written by the store.
CRC_READ = 1 << 20
#: The piece of a body read through the buffer and written at a time by
#: direct I/O: large enough for the device, small enough that its CRC reads
#: it from the CPU's cache.
PIECE = 4 << 20

DIRECT, SPLICED, BUFFERED = "direct", "spliced", "buffered"


def offers(store: Store, method: str) -> bool:
    # Looked up on the class: a wrapper that forwards unknown attributes
    # (fault injection in the tests) keeps its own reads.
    return callable(getattr(type(store), method, None))


def to_file(store: Store) -> bool:
    """Whether the store can move ranges straight into a file (spliced)."""
    return offers(store, "get_range_to_file") and getattr(store, "splices", False) is True


def choose(store: Store, staging: Path, direct_io: bool = True) -> str:
    """How this restore writes its ranges into `staging`: DIRECT onto a
    disk (unless `direct_io` is False), else SPLICED where the store can,
    else BUFFERED."""
    if direct_io and offers(store, "get_range_into") and direct_io_mod.worthwhile(staging):
        return DIRECT
    return SPLICED if to_file(store) else BUFFERED


def largest_range(store: Store, mode: str) -> int:
    """The largest ranged GET for `mode` (range_size's `largest`)."""
    streamed = mode == DIRECT and offers(store, "get_range_through")
    return MAX_FILE_RANGE if mode == SPLICED or streamed else MAX_RANGE


def aligned_range(mode: str, size: int) -> int:
    """A range size fit for `mode`: for DIRECT, a multiple of the alignment
    of direct writes, or every range after the first unaligned one would
    go through the page cache (parts of 8MB, 100MB... are not)."""
    if mode != DIRECT or size < direct_io_mod.ALIGN:
        return size
    return size - size % direct_io_mod.ALIGN


def worker_buffer(store: Store, mode: str, biggest: int) -> memoryview | None:
    """The buffer one worker reuses for every range of at most `biggest`
    bytes: one byte more where it holds whole ranges (the last range asks
    for it); page-aligned for direct I/O; small where the store writes the
    file and the buffer only reads the CRC back."""
    if mode == SPLICED:
        return memoryview(bytearray(CRC_READ))
    if mode == DIRECT:
        streamed = offers(store, "get_range_through")
        return direct_io_mod.aligned_buffer(PIECE if streamed else biggest + 1)
    return memoryview(bytearray(biggest + 1)) if offers(store, "get_range_into") else None


def fetch_range(store: Store, mode: str, key: str, target: Path, size: int, offset: int,
                length: int, buffer: memoryview | None) -> tuple[int, int]:
    """Bytes `offset`..+`length` of `key` (an object of `size` bytes by its
    manifest) written into `target` at the same offset, the `mode` way, with
    the worker's `buffer`; (their CRC32C, how many went by direct I/O).
    IntegrityError when the object is longer or shorter than `size`; the
    file's own failures as OSError."""
    last = offset + length == size
    # One byte more on the last range reveals an object longer than the manifest says.
    want = length + 1 if last else length
    if mode == SPLICED:
        assert buffer is not None
        return _fetch_range_to_file(store, key, target, size, offset, length, want, buffer), 0
    if mode == DIRECT and offers(store, "get_range_through"):
        assert buffer is not None
        return _fetch_range_through(store, key, target, size, offset, length, want, buffer)
    data: bytes | memoryview
    if buffer is not None:
        got = store.get_range_into(key, offset, buffer[:want])  # type: ignore[attr-defined]
        data = buffer[:got]
    else:
        data = store.get_range(key, offset, want)
    _check_length(key, size, len(data), length)
    crc = checksum.crc32c(data)
    if mode == DIRECT:
        with direct_io_mod.DirectFile(target) as out:
            out.write(memoryview(data), offset)
        return crc, out.direct
    fd = os.open(target, os.O_WRONLY)
    try:
        pwrite_all(fd, data, offset)
    finally:
        os.close(fd)
    return crc, 0


def _fetch_range_through(store: Store, key: str, target: Path, size: int, offset: int,
                         length: int, want: int, buffer: memoryview) -> tuple[int, int]:
    """One GET for the range, its body a buffer-full at a time: the CRC
    taken while the piece is in the CPU's cache, then written by direct I/O
    (a longer object's extra byte is counted, never written)."""
    crc, seen = 0, 0
    with direct_io_mod.DirectFile(target) as out:
        def take(piece: memoryview) -> None:
            nonlocal crc, seen
            keep = piece[: max(0, length - seen)]
            if len(keep):
                crc = checksum.crc32c(keep, crc)
                out.write(keep, offset + seen)
            seen += len(piece)

        got = store.get_range_through(key, offset, want, buffer, take)  # type: ignore[attr-defined]
    _check_length(key, size, got, length)
    return crc, out.direct


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
