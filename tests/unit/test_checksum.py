"""CRC32C: the standard check value, streaming, and combine of adjacent ranges."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain import checksum


def test_standard_check_value() -> None:
    assert checksum.crc32c(b"123456789") == 0xE3069283  # CRC-32C (Castagnoli) check


@given(st.binary(max_size=4096), st.binary(max_size=4096))
def test_combine_equals_crc_of_concatenation(a: bytes, b: bytes) -> None:
    whole = checksum.crc32c(a + b)
    assert checksum.combine(checksum.crc32c(a), checksum.crc32c(b), len(b)) == whole
    assert checksum.crc32c(b, checksum.crc32c(a)) == whole


@given(st.lists(st.binary(max_size=1000), max_size=10))
def test_combine_many_parts(parts: list[bytes]) -> None:
    crc = 0
    for p in parts:
        crc = checksum.combine(crc, checksum.crc32c(p), len(p))
    assert crc == checksum.crc32c(b"".join(parts))


@given(st.binary(max_size=4096), st.binary(max_size=4096))
def test_python_fallback_combine_agrees(a: bytes, b: bytes) -> None:
    # The fallback for an awscrt without combine_crc32c must give the same answers.
    crc_a, crc_b = checksum.crc32c(a), checksum.crc32c(b)
    assert checksum._combine_python(crc_a, crc_b, len(b)) == checksum.crc32c(a + b)


@pytest.mark.parametrize("length", [1, 16 << 20, (5 << 30) + 7, 1 << 50])
def test_combine_of_long_ranges_agrees_with_the_fallback(length: int) -> None:
    # Lengths no test can materialise: the native and the Python operator
    # tables must agree on every bit of the length.
    if checksum._combine_native is None:
        pytest.skip("this awscrt has no native combine")
    assert checksum.combine(0x12345678, 0x9ABCDEF0, length) == \
        checksum._combine_python(0x12345678, 0x9ABCDEF0, length)


def test_stream_and_file(tmp_path: Path) -> None:
    data = bytes(range(256)) * 50_000
    assert checksum.crc32c_stream(io.BytesIO(data), read_size=4096) == (
        len(data), checksum.crc32c(data))
    (tmp_path / "f").write_bytes(data)
    assert checksum.crc32c_file(tmp_path / "f") == (len(data), checksum.crc32c(data))


def test_hex_round_trip_and_refusal() -> None:
    assert checksum.from_hex(checksum.to_hex(0xE3069283)) == 0xE3069283
    for bad in ["E3069283", "123", "zzzzzzzz"]:
        with pytest.raises(ValueError):
            checksum.from_hex(bad)


@pytest.mark.parametrize(("offset", "length"), [
    (0, 0), (0, 1), (1, 4095), (4095, 2), (65536, 65536), (12345, 287_655), (299_999, 1)])
def test_crc_of_a_file_range_is_the_crc_of_those_bytes(tmp_path: Path, offset: int,
                                                       length: int) -> None:
    """Read back from any offset through a buffer of any size: the same CRC
    as of the bytes themselves; a file shorter than asked is an error."""
    data = os.urandom(300_000)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        for size in (1, 4096, 1 << 20):
            buffer = memoryview(bytearray(size))
            assert checksum.crc32c_range(fd, offset, length, buffer) == checksum.crc32c(
                data[offset:offset + length])
        with pytest.raises(OSError, match="early"):
            checksum.crc32c_range(fd, offset, len(data) - offset + 1, buffer)
    finally:
        os.close(fd)
