"""S3Store's ranged read straight into a file: what a restore from a plain
HTTP endpoint uses (store/splice.py says why), with the checks of
get_range_into: a missing key, a wrong answer to the range, a connection
that breaks or stalls mid-body."""

from __future__ import annotations

import http.client
import os
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, NoReturn

from botocore.exceptions import BotoCoreError, ClientError

from ckptdrain.errors import InvalidInput, ObjectMissing, StoreError, StoreUnreachable
from ckptdrain.store import splice
from ckptdrain.store.base import ObjectInfo

#: Bytes the fallback reads at a time (a body that is not spliced).
_CHUNK = 1 << 20


class S3RangeToFile:
    """S3Store.get_range_to_file (not part of the Store protocol)."""

    endpoint: str
    #: Whether responses come over plain TCP (an http:// endpoint), so that
    #: get_range_to_file can splice them: what a restore asks before sizing
    #: its ranges.
    splices: bool

    if TYPE_CHECKING:  # S3Store's own helpers
        def _key(self, key: str) -> str: ...
        def _fail(self, err: Exception, op: str, key: str | None = None) -> NoReturn: ...
        def _call(self, op: str, key: str | None, *, handled: Collection[str] = (),
                  **kwargs: Any) -> Any: ...
        def _range_answer(self, response: dict[str, Any], key: str, start: int,
                          length: int) -> int: ...
        def head(self, key: str) -> ObjectInfo | None: ...

    def get_range_to_file(self, key: str, start: int, length: int, fd: int, offset: int) -> int:
        """Write up to `length` bytes of `key` from `start` into file `fd` at
        `offset`; return how many (fewer only where the object ends).
        ObjectMissing, StoreError and StoreUnreachable as get_range_into."""
        if start < 0 or length < 0:
            raise InvalidInput("range", "start >= 0 and length >= 0", (start, length))
        if length == 0:
            if self.head(key) is None:
                raise ObjectMissing(key)
            return 0
        response = self._call("get_object", key, handled={"InvalidRange"}, Key=self._key(key),
                              Range=f"bytes={start}-{start + length - 1}")
        if isinstance(response, ClientError):
            return 0  # start at or past the end (416); the key exists
        expected = self._range_answer(response, key, start, length)
        body = response["Body"]
        raw = getattr(body, "_raw_stream", None)
        fp = getattr(raw, "_fp", None)
        sock = getattr(getattr(raw, "connection", None), "sock", None)
        try:
            if (isinstance(fp, http.client.HTTPResponse) and not getattr(raw, "chunked", False)
                    and splice.spliceable(sock)):
                got = _splice_body(fp, sock, fd, offset, expected)
            else:
                got = _copy(body, fd, offset, expected, self._what(key))
        except splice.SocketFailed as err:
            raise StoreUnreachable(
                f"get_object {key}: the connection to {self.endpoint} broke mid-body "
                f"({err})") from err
        finally:
            # Read to its end or not, the connection is closed rather than
            # reused (http.client never saw the spliced bytes), and its slot
            # goes back to the pool.
            body.close()
            if hasattr(raw, "release_conn"):
                raw.release_conn()
        if got != expected:
            raise StoreUnreachable(
                f"get_object {key}: the connection to {self.endpoint} closed after {got} "
                f"of {expected} bytes")
        return got

    def _what(self, key: str) -> str:
        return f"get_object {key} from {self.endpoint}"


def _splice_body(fp: http.client.HTTPResponse, sock: Any, fd: int, offset: int,
                 expected: int) -> int:
    # What http.client read past the headers is in its buffer (8 KiB;
    # read1 of more returns all of it, or reads the socket once when it is
    # empty): that part the usual way, then the socket.
    head = _read(fp.read1, min(expected, _CHUNK))
    _pwrite_all(fd, head, offset)
    got = len(head)
    try:
        return got + splice.socket_to_file(sock, fd, offset + got, expected - got)
    except splice.Refused as refused:
        # The rest is copied from the socket too: http.client's count of
        # what is left knows nothing of what was spliced.
        got += refused.moved
        return got + splice.socket_copy_to_file(sock, fd, offset + got, expected - got)


def _read(read: Any, n: int) -> bytes:
    """`read(n)` of a response body, its failures as the connection's."""
    try:
        return bytes(read(n))
    except (OSError, http.client.HTTPException, BotoCoreError) as err:
        raise splice.SocketFailed(type(err).__name__) from err


def _copy(body: Any, fd: int, offset: int, expected: int, what: str) -> int:
    """A body that cannot be spliced, in bounded chunks; one byte more than
    expected is read if there is one, so a longer body is seen."""
    got = 0
    while got <= expected:
        chunk = _read(body.read, min(expected + 1 - got, _CHUNK))
        if not chunk:
            break
        if got + len(chunk) > expected:
            raise StoreError(f"{what}: a body longer than the {expected} bytes announced")
        _pwrite_all(fd, chunk, offset + got)
        got += len(chunk)
    return got


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view, done = memoryview(data), 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
