"""A fault-injecting wrapper around a REAL store, for failure tests.

    store = FaultyStore(real_store)
    store.fail("upload_part", on_call=3)                 # 3rd upload_part raises
    store.fail("get_range", on_call=1, times=2,          # 1st and 2nd get_range
               error=lambda: StoreUnreachable("boom"))   # raise a custom error
    store.corrupt("ckpt/rank0.bin")                      # reads of it flip a byte
    store.delay("put_bytes", seconds=0.2)                # every put_bytes is slow
    ... run the code under test ...
    assert store.calls["upload_part"] == 7

Faults fire *instead of* the real call (the store is untouched), so a test
can tell "the call failed" from "the call happened". Call counts include
failed calls. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from ckptdrain.errors import StoreUnreachable
from ckptdrain.store.base import ObjectInfo, Store, UploadedPart

ErrorFactory = Callable[[], BaseException]


@dataclass
class _Failure:
    first_call: int  # 1-based call number of the method that fails first
    times: int  # how many consecutive calls fail from there
    error: ErrorFactory


def _default_error(method: str) -> ErrorFactory:
    return lambda: StoreUnreachable(f"injected fault: {method} did not answer")


class FaultyStore:
    """Wraps a Store; every method counts, may sleep, fail, or corrupt reads."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.calls: Counter[str] = Counter()
        self._failures: dict[str, list[_Failure]] = {}
        self._delays: dict[str, float] = {}
        self._corrupt: set[str] = set()
        self._lock = threading.Lock()

    # Arming faults -------------------------------------------------------------
    def fail(
        self,
        method: str,
        *,
        on_call: int | None = None,
        times: int = 1,
        error: ErrorFactory | None = None,
    ) -> None:
        """Make calls on_call .. on_call+times-1 of `method` raise `error()`.

        on_call counts from the wrapper's creation (1 = the first call ever);
        None means the next call. The default error is StoreUnreachable.
        """
        if not hasattr(self.inner, method):
            raise AttributeError(f"the store has no method {method!r}")
        with self._lock:
            first = self.calls[method] + 1 if on_call is None else on_call
            failure = _Failure(first, times, error or _default_error(method))
            self._failures.setdefault(method, []).append(failure)

    def delay(self, method: str | None, seconds: float) -> None:
        """Sleep `seconds` before every call of `method` (None: every method)."""
        with self._lock:
            self._delays[method or "*"] = seconds

    def corrupt(self, key: str) -> None:
        """Flip the first byte of whatever get_bytes/get_range return for `key`."""
        with self._lock:
            self._corrupt.add(key)

    def clear(self) -> None:
        """Disarm every fault; counts stay."""
        with self._lock:
            self._failures.clear()
            self._delays.clear()
            self._corrupt.clear()

    # Plumbing --------------------------------------------------------------------
    def _enter(self, method: str) -> None:
        """Count the call, then sleep and/or raise as armed."""
        with self._lock:
            self.calls[method] += 1
            number = self.calls[method]
            pause = self._delays.get(method, self._delays.get("*", 0.0))
            error: BaseException | None = None
            for failure in self._failures.get(method, []):
                if failure.first_call <= number < failure.first_call + failure.times:
                    error = failure.error()
                    break
        if pause:
            time.sleep(pause)
        if error is not None:
            raise error

    def _maybe_corrupt(self, key: str, data: bytes) -> bytes:
        with self._lock:
            hit = key in self._corrupt
        if hit and data:
            return bytes([data[0] ^ 0xFF]) + data[1:]
        return data

    # The Store protocol ------------------------------------------------------------
    @property
    def min_part_size(self) -> int:
        return self.inner.min_part_size

    def put_bytes(self, key: str, data: bytes, crc32c: int | None = None) -> None:
        self._enter("put_bytes")
        self.inner.put_bytes(key, data, crc32c)

    def put_stream(self, key: str, stream: BinaryIO, size: int) -> None:
        self._enter("put_stream")
        self.inner.put_stream(key, stream, size)

    def get_bytes(self, key: str, *, limit: int | None = None) -> bytes:
        self._enter("get_bytes")
        return self._maybe_corrupt(key, self.inner.get_bytes(key, limit=limit))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        self._enter("get_range")
        return self._maybe_corrupt(key, self.inner.get_range(key, start, length))

    def head(self, key: str) -> ObjectInfo | None:
        self._enter("head")
        return self.inner.head(key)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self._enter("list")
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self._enter("delete")
        self.inner.delete(key)

    def create_multipart(self, key: str) -> str:
        self._enter("create_multipart")
        return self.inner.create_multipart(key)

    def upload_part(
        self, key: str, upload_id: str, number: int, data: bytes, crc32c: int | None = None
    ) -> UploadedPart:
        self._enter("upload_part")
        return self.inner.upload_part(key, upload_id, number, data, crc32c)

    def upload_part_from(self, key: str, upload_id: str, number: int, stream: BinaryIO,
                         size: int, crc32c: int) -> UploadedPart:
        self._enter("upload_part_from")
        return self.inner.upload_part_from(key, upload_id, number, stream, size, crc32c)

    def list_parts(self, key: str, upload_id: str) -> list[UploadedPart] | None:
        self._enter("list_parts")
        return self.inner.list_parts(key, upload_id)

    def complete_multipart(self, key: str, upload_id: str, parts: list[UploadedPart]) -> None:
        self._enter("complete_multipart")
        self.inner.complete_multipart(key, upload_id, parts)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        self._enter("abort_multipart")
        self.inner.abort_multipart(key, upload_id)

    def __getattr__(self, name: str) -> Any:
        # Anything beyond the protocol (e.g. LocalStore.root) passes through.
        if name == "inner":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)
