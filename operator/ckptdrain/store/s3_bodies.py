"""Request bodies for the S3 store: stream what the caller has, copy nothing
whole, and let a rate limiter pace the bytes as they reach the socket.

botocore rewinds a body with seek(0) before signing and before a retry, so
both bodies are seekable views rather than one-shot streams.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any, BinaryIO

from ckptdrain.errors import IntegrityError


class WindowBody(io.RawIOBase):
    """Exactly `size` bytes of a stream, from where it stands now.

    botocore rewinds a body with seek(0) before a retry; this makes 0 mean
    "where the caller's stream was", and stops reads at `size`. With `pace`,
    each block is handed to it before it is read (as PacedBody does); with
    `strict`, a stream that ends before `size` raises IntegrityError rather
    than leaving the request short (a file that shrank while being sent).
    """

    def __init__(self, stream: BinaryIO, size: int,
                 pace: Callable[[int], object] | None = None, strict: bool = False) -> None:
        self._stream = stream
        self._size = size
        self._pos = 0
        self._origin = stream.tell() if stream.seekable() else None
        self._pace = pace
        self._strict = strict

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._origin is not None

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if self._origin is None:
            raise io.UnsupportedOperation("stream is not seekable")
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, min(self._size, base + offset))
        self._stream.seek(self._origin + self._pos)
        return self._pos

    def read(self, n: int = -1) -> bytes:
        left = self._size - self._pos
        n = left if n is None or n < 0 else min(n, left)
        if self._pace is not None and n:
            self._pace(n)
        data = self._stream.read(n) if n else b""
        if self._strict and len(data) < n:
            raise IntegrityError(f"the stream ended {left - len(data)} bytes before its "
                                 f"{self._size}-byte window")
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class PacedBody(io.RawIOBase):
    """A bytes-like body sent without a whole copy, through an optional pacer.

    http.client reads it in small blocks; each block is handed to `pace`
    first, so a rate limiter throttles the bytes as they go to the socket
    (not a whole part at once). A retry rewinds and re-reads, and is paced
    again: those bytes really are sent twice.
    """

    def __init__(self, data: bytes | bytearray | memoryview,
                 pace: Callable[[int], object] | None) -> None:
        self._view = memoryview(data).cast("B")
        self._pace = pace
        self._pos = 0

    def __len__(self) -> int:
        return len(self._view) - self._pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, min(len(self._view), base + offset))
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = len(self._view) if n is None or n < 0 else min(len(self._view), self._pos + n)
        if self._pace is not None and end > self._pos:
            self._pace(end - self._pos)
        data = bytes(self._view[self._pos:end])
        self._pos = end
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
