"""The gs:// store's upload body: one multipart/related request of GCS's
JSON API, the object's metadata (its name and CRC32C, which GCS checks)
then its bytes, read from a seekable view so a retry can send it again."""

from __future__ import annotations

import io
import json
import secrets
from typing import Any


class RelatedBody(io.RawIOBase):
    """A multipart/related upload body: the object's JSON metadata, then its
    bytes from `inner` (a seekable view), then the closing boundary. A retry
    rewinds the whole of it."""

    def __init__(self, metadata: dict[str, Any], inner: Any) -> None:
        boundary = f"ckptdrain-{secrets.token_hex(12)}"
        self.content_type = f"multipart/related; boundary={boundary}"
        self._head = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
                      f"{json.dumps(metadata)}\r\n--{boundary}\r\n"
                      "Content-Type: application/octet-stream\r\n\r\n").encode()
        self._tail = f"\r\n--{boundary}--\r\n".encode()
        self._inner = inner
        self._pos = 0  # bytes of the head read
        self._in_tail = 0  # bytes of the tail read

    def extra(self) -> int:
        return len(self._head) + len(self._tail)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if (offset, whence) != (0, io.SEEK_SET):
            raise io.UnsupportedOperation("only a rewind to the start")
        self._inner.seek(0)
        self._pos, self._in_tail = 0, 0
        return 0

    def read(self, n: int = -1) -> bytes:
        n = 1 << 62 if n is None or n < 0 else n
        if self._pos < len(self._head):
            data = self._head[self._pos:self._pos + n]
            self._pos += len(data)
            return data
        data = self._inner.read(n)
        if data:
            return bytes(data)
        data = self._tail[self._in_tail:self._in_tail + n]
        self._in_tail += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
