"""GcsStore's ranged reads: into new bytes or into the caller's buffer, each
answer checked against the range asked for (as S3Store's are,
s3_ranged_reads.py), a start at or past the end read as nothing, and a
connection that breaks mid-body reported as such."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import urllib3

from ckptdrain.errors import InvalidInput, ObjectMissing, StoreError, StoreUnreachable

if TYPE_CHECKING:
    from ckptdrain.store.base import ObjectInfo


class GcsRangedReads:
    """GcsStore's ranged reads (the Store protocol's `get_range*`)."""

    endpoint: str

    if TYPE_CHECKING:  # GcsStore's own helpers
        def _name(self, key: str) -> str: ...
        def _object_url(self, name: str, media: bool = False) -> str: ...
        def _where(self, key: str | None) -> str: ...
        def _request(self, op: str, method: str, url: str, key: str | None, *,
                     body: Any = None, size: int = 0, headers: Any = None,
                     stream: bool = False, missing: bool = False
                     ) -> urllib3.BaseHTTPResponse | None: ...
        def _read(self, response: urllib3.BaseHTTPResponse, key: str,
                  most: int | None) -> bytes: ...
        def _broke(self, key: str, err: BaseException) -> StoreUnreachable: ...
        def head(self, key: str) -> ObjectInfo | None: ...

    def _ranged(self, key: str, start: int, length: int) -> tuple[
            urllib3.BaseHTTPResponse, int] | None:
        """The answer to a ranged GET and how many bytes it holds, once it is
        the range asked for (as S3Store._range_answer); None past the end."""
        response = self._request("get", "GET", self._object_url(self._name(key), media=True),
                                 key, stream=True, missing=True,
                                 headers={"Range": f"bytes={start}-{start + length - 1}"})
        if response is None:
            raise ObjectMissing(key)
        announced = response.headers.get("Content-Length")
        size = int(announced) if announced is not None else None
        problem = None
        if response.status == 206:
            content_range = str(response.headers.get("Content-Range", ""))
            try:
                first_last, total = content_range.split(" ", 1)[1].split("/")
                first, last = (int(x) for x in first_last.split("-"))
            except (IndexError, ValueError):
                problem = f"a 206 answer without a valid Content-Range ({content_range!r})"
            else:
                count = last - first + 1
                short = total != "*" and last != min(start + length, int(total)) - 1
                if first != start or not 0 < count <= length or size not in (None, count) \
                        or short:
                    problem = f"bytes {first}-{last}"
                size = count
        elif response.status == 200:
            if start != 0 or size is None or size > length:
                problem = f"status 200, the whole object ({size} bytes): the range was ignored"
        else:
            problem = f"status {response.status}"
        if problem is not None or size is None:
            response.close()  # the body unread: the connection is dropped
            raise StoreError(f"get {self._where(key)}: asked bytes {start}-{start + length - 1} "
                             f"from {self.endpoint}, got {problem}")
        return response, size

    def _range_or_end(self, key: str, start: int, length: int) -> tuple[
            urllib3.BaseHTTPResponse, int] | None:
        try:
            return self._ranged(key, start, length)
        except StoreError as err:
            if "HTTP 416" in str(err):
                return None  # start at or past the end; the key exists
            raise

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise InvalidInput("range", "start >= 0 and length >= 0", (start, length))
        if length == 0:
            if self.head(key) is None:
                raise ObjectMissing(key)
            return b""
        answer = self._range_or_end(key, start, length)
        if answer is None:
            return b""
        response, expected = answer
        data = self._read(response, key, expected)
        if len(data) != expected:
            raise StoreUnreachable(f"get {self._where(key)}: {len(data)} of {expected} bytes "
                                   "before the connection closed")
        return data

    def get_range_into(self, key: str, start: int, buffer: memoryview) -> int:
        view = memoryview(buffer).cast("B")
        if start < 0:
            raise InvalidInput("range", "start >= 0", start)
        if len(view) == 0:
            if self.head(key) is None:
                raise ObjectMissing(key)
            return 0
        answer = self._range_or_end(key, start, len(view))
        if answer is None:
            return 0
        response, expected = answer
        got = 0
        try:
            while got < expected:
                n = response.readinto(view[got:expected])
                if not n:
                    break
                got += n
        except (urllib3.exceptions.HTTPError, OSError) as err:
            response.release_conn()
            raise self._broke(key, err) from None
        response.release_conn()
        if got != expected:
            raise StoreUnreachable(f"get {self._where(key)}: the connection to {self.endpoint} "
                                   f"closed after {got} of {expected} bytes")
        return got
