"""CRC32C checksums: native (awscrt, SSE4.2/ARMv8 with folding), streaming, combinable.

awscrt measured ~8 GiB/s on one core here against ~0.7 GiB/s for google-crc32c,
and it takes memoryviews, so streaming needs no copies.

`combine` joins the CRCs of two adjacent byte ranges without re-reading them,
so parts uploaded or downloaded in parallel still yield the whole file's CRC.
"""

from __future__ import annotations

import base64
import errno
import os
from typing import BinaryIO

from awscrt import checksums as _crt

#: Reflected Castagnoli polynomial.
_POLY = 0x82F63B78
_READ_SIZE = 8 << 20


def crc32c(data: bytes | memoryview, crc: int = 0) -> int:
    """CRC32C of `data`, continuing from `crc` (0 to start)."""
    return _crt.crc32c(data, crc)


def to_hex(crc: int) -> str:
    return f"{crc:08x}"


def from_hex(text: str) -> int:
    if len(text) != 8 or any(c not in "0123456789abcdef" for c in text):
        raise ValueError(f"not an 8-digit lowercase hex CRC32C: {text!r}")
    return int(text, 16)


def to_b64(crc: int) -> str:
    """The wire form S3 (x-amz-checksum-crc32c) and GCS both use: base64 of
    the CRC's 4 big-endian bytes."""
    return base64.b64encode(crc.to_bytes(4, "big")).decode("ascii")


def from_b64(text: object) -> int | None:
    """A CRC32C in its wire form, or None when there is none (or nonsense)."""
    if not text:
        return None
    try:
        raw = base64.b64decode(str(text), validate=True)
    except (ValueError, TypeError):
        return None
    return int.from_bytes(raw, "big") if len(raw) == 4 else None


def crc32c_stream(stream: BinaryIO, read_size: int = _READ_SIZE) -> tuple[int, int]:
    """(bytes read, CRC32C) of everything left in `stream`, in bounded memory."""
    crc, size = 0, 0
    buf = bytearray(read_size)
    view = memoryview(buf)
    while True:
        n = stream.readinto(buf)
        if not n:
            return size, crc
        crc = _crt.crc32c(view[:n], crc)
        size += n


def crc32c_file(path: str | os.PathLike[str]) -> tuple[int, int]:
    """(size, CRC32C) of a file, in bounded memory."""
    with open(path, "rb", buffering=0) as f:
        return crc32c_stream(f)  # type: ignore[arg-type]


def crc32c_range(fd: int, offset: int, length: int, buffer: memoryview) -> int:
    """CRC32C of `length` bytes of open file `fd` from `offset`, read back
    through `buffer` (reused: no allocation per call). Read, not mapped: an
    I/O error of a mapped page would kill the process (SIGBUS) where a read
    raises OSError. A file shorter than asked is an OSError (EIO) too: its
    caller wrote those bytes itself."""
    crc, done = 0, 0
    while done < length:
        n = os.preadv(fd, [buffer[: min(len(buffer), length - done)]], offset + done)
        if n == 0:
            raise OSError(errno.EIO, f"the file ends {length - done} bytes early at "
                          f"{offset + done}")
        crc = crc32c(buffer[:n], crc)
        done += n
    return crc


def _gf2_times(matrix: list[int], vector: int) -> int:
    total, i = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[i]
        vector >>= 1
        i += 1
    return total


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_times(matrix, row) for row in matrix]


def _zero_operators() -> list[list[int]]:
    """Operator n appends 2**n zero bytes to a CRC; 64 of them cover any length."""
    one_bit = [_POLY] + [1 << (n - 1) for n in range(1, 32)]
    op = _gf2_square(_gf2_square(_gf2_square(one_bit)))  # eight zero bits: one byte
    ops = []
    for _ in range(64):
        ops.append(op)
        op = _gf2_square(op)
    return ops


_ZERO_OPERATORS: list[list[int]] = []


def _combine_python(crc1: int, crc2: int, len2: int) -> int:
    if not _ZERO_OPERATORS:
        _ZERO_OPERATORS.extend(_zero_operators())
    bit = 0
    while len2:
        if len2 & 1:
            crc1 = _gf2_times(_ZERO_OPERATORS[bit], crc1)
        len2 >>= 1
        bit += 1
    return crc1 ^ crc2


# Recent awscrt releases have it natively; squaring GF(2) matrices in Python cost
# ~1.6 ms a call, 0.1 core-s per GB restored in 16 MiB ranges.
_combine_native = getattr(_crt, "combine_crc32c", None)


def combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC32C of A+B from crc(A), crc(B) and len(B) (zlib's crc32_combine)."""
    if len2 <= 0:
        return crc1
    if _combine_native is not None:
        return _combine_native(crc1, crc2, len2)
    return _combine_python(crc1, crc2, len2)
