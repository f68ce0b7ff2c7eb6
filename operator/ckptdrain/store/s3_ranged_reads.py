"""S3Store's ranged reads: into new bytes, into the caller's buffer, through
the caller's buffer a piece at a time (what a restore that writes by direct
I/O uses: transfer/direct_io.py), or straight into a file (what a restore
from a plain HTTP endpoint into memory uses: store/splice.py says why),
each answer checked against the range asked for, and a connection that
breaks or stalls mid-body reported as such."""

from __future__ import annotations

import http.client
import re
import sys
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from botocore.exceptions import BotoCoreError, ClientError

from ckptdrain.errors import InvalidInput, ObjectMissing, StoreError, StoreUnreachable
from ckptdrain.localfs import pwrite_all
from ckptdrain.store import splice
from ckptdrain.store.base import ObjectInfo

#: Bytes the fallback reads at a time (a body that is not spliced).
_CHUNK = 1 << 20
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class Wire(NamedTuple):
    """What carries an answer's body: http.client's response (None where
    the transport is another), its socket, whether it is chunked, and how
    to give the connection back once the body was read to its end."""

    fp: Any
    sock: Any
    chunked: bool
    release: Callable[[], None]


def _short(response: dict[str, Any]) -> str:
    """The framing headers of an answer, for a message (no secrets in them)."""
    return (f"Content-Range {str(response.get('ContentRange'))[:80]!r}, "
            f"Content-Length {response.get('ContentLength')!r}")


class S3RangedReads:
    """S3Store.get_range, get_range_into, get_range_through and get_range_to_file."""

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
        def _read_body(self, response: dict[str, Any], op: str, key: str,
                       limit: int | None = None) -> bytes: ...
        def head(self, key: str) -> ObjectInfo | None: ...

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Up to `length` bytes from `start`; fewer only where the object ends."""
        answer = self._ranged_get(key, start, length)
        if answer is None:
            return b""
        response, expected = answer
        data = self._read_body(response, "get_object", key, length)
        if len(data) != expected:
            raise StoreError(f"get_object {key}: {len(data)} bytes where the answer to the "
                             f"{length}-byte range from {start} announced {expected}")
        return data

    def get_range_into(self, key: str, start: int, buffer: memoryview) -> int:
        """Read up to len(buffer) bytes from `start` into `buffer`; return how
        many (fewer only where the object ends). ObjectMissing as get_range.

        The body goes from the socket straight into the caller's buffer
        (http.client's readinto under urllib3): get_range's body.read() makes
        the bytes twice more (http.client's read(amt) copies its bytearray,
        urllib3 joins its chunks) before the caller writes them out."""
        view = memoryview(buffer).cast("B")
        length = len(view)
        answer = self._ranged_get(key, start, length)
        if answer is None:
            return 0
        response, expected = answer
        body, wire = response["Body"], _wire(response)
        fp = wire.fp
        if not isinstance(fp, http.client.HTTPResponse) or wire.chunked:
            data = self._read_body(response, "get_object", key, length)  # any other transport
            if len(data) != expected:
                raise StoreError(f"get_object {key}: {len(data)} bytes where the answer to "
                                 f"the {length}-byte range from {start} announced {expected}")
            view[: len(data)] = data
            return len(data)
        got = 0
        try:
            while got < expected:
                n = fp.readinto(view[got:expected])
                if not n:
                    break
                got += n
        except (OSError, http.client.HTTPException) as err:
            body.close()
            raise StoreUnreachable(
                f"get_object {key}: the connection to {self.endpoint} broke mid-body "
                f"({type(err).__name__})") from err
        if got != expected:
            body.close()
            raise StoreUnreachable(
                f"get_object {key}: the connection to {self.endpoint} closed after {got} "
                f"of {expected} bytes")
        if fp.isclosed():
            wire.release()  # read to its end: the connection is reusable
        body.close()
        return got

    def get_range_through(self, key: str, start: int, length: int, buffer: memoryview,
                          take: Callable[[memoryview], None]) -> int:
        """Read up to `length` bytes of `key` from `start` with one GET,
        through `buffer`: `take` is handed each filled part, the whole of
        `buffer` but for the last; return how many bytes (fewer only where
        the object ends). Failures as get_range_into; what `take` raises
        (the file's own errors) passes through unchanged."""
        view = memoryview(buffer).cast("B")
        if len(view) == 0:
            raise InvalidInput("buffer", "at least one byte", 0)
        answer = self._ranged_get(key, start, length)
        if answer is None:
            return 0
        body, wire = answer[0]["Body"], _wire(answer[0])
        fp, expected = wire.fp, answer[1]
        direct = isinstance(fp, http.client.HTTPResponse) and not wire.chunked
        got = 0
        try:
            while got < expected:
                room = min(len(view), expected - got)
                filled = _fill(fp.readinto if direct else _reader(body), view[:room])
                if filled:
                    take(view[:filled])
                got += filled
                if filled < room:
                    break
            if not direct and got == expected and _read(body.read, 1):
                raise StoreError(f"{self._what(key)}: a body longer than the {expected} "
                                 f"bytes announced")
        except splice.SocketFailed as err:
            _drop(body, wire)
            raise StoreUnreachable(
                f"get_object {key}: the connection to {self.endpoint} broke mid-body "
                f"({err})") from err
        except BaseException:
            _drop(body, wire)
            raise
        if got != expected:
            _drop(body, wire)
            raise StoreUnreachable(
                f"get_object {key}: the connection to {self.endpoint} closed after {got} "
                f"of {expected} bytes")
        if direct and fp.isclosed():
            wire.release()  # read to its end: the connection is reusable
        body.close()
        return got

    def get_range_to_file(self, key: str, start: int, length: int, fd: int, offset: int) -> int:
        """Write up to `length` bytes of `key` from `start` into file `fd` at
        `offset`; return how many (fewer only where the object ends).
        ObjectMissing, StoreError and StoreUnreachable as get_range_into; the
        file's own failures (ENOSPC, EIO) as the OSError it gives."""
        if offset < 0:
            raise InvalidInput("offset", "a file offset >= 0", offset)
        answer = self._ranged_get(key, start, length)
        if answer is None:
            return 0
        body, wire = answer[0]["Body"], _wire(answer[0])
        fp, expected = wire.fp, answer[1]
        reusable = False
        try:
            if (isinstance(fp, http.client.HTTPResponse) and not wire.chunked
                    and splice.spliceable(wire.sock)):
                got, spliced = _splice_body(fp, wire.sock, fd, offset, expected)
                reusable = got == expected and _consumed(fp, spliced)
            else:
                got = _copy(body, fd, offset, expected, self._what(key))
        except splice.SocketFailed as err:
            raise StoreUnreachable(
                f"get_object {key}: the connection to {self.endpoint} broke mid-body "
                f"({err})") from err
        finally:
            if reusable:  # read to its end: the connection serves the next GET
                wire.release()
                body.close()
            else:
                _drop(body, wire)
        if got != expected:
            raise StoreUnreachable(
                f"get_object {key}: the connection to {self.endpoint} closed after {got} "
                f"of {expected} bytes")
        return got

    def _what(self, key: str) -> str:
        return f"get_object {key} from {self.endpoint}"

    def _ranged_get(self, key: str, start: int, length: int) -> tuple[dict[str, Any], int] | None:
        """The answer to a GET of `length` bytes from `start` and how many
        bytes its body holds, checked (_range_answer); None when there is
        nothing to read (no bytes asked, or `start` at or past the end).
        ObjectMissing for a missing key."""
        if start < 0 or length < 0:
            raise InvalidInput("range", "start >= 0 and length >= 0", (start, length))
        if length == 0:
            if self.head(key) is None:
                raise ObjectMissing(key)
            return None
        response = self._call("get_object", key, handled={"InvalidRange"}, Key=self._key(key),
                              Range=f"bytes={start}-{start + length - 1}")
        if isinstance(response, ClientError):
            return None  # start at or past the end (416); the key exists
        return response, self._range_answer(response, key, start, length)

    def _range_answer(self, response: dict[str, Any], key: str, start: int, length: int) -> int:
        """How many bytes the answer to a ranged GET holds, once it is known to
        be the range asked for; else StoreError, the body left unread.

        A 206 must name, in Content-Range, a range that starts at `start` and
        is no longer than `length`. A 200 (a server or proxy that ignored the
        Range header) is the whole object: right only from 0 and when it fits.
        Anything else would be read whole into memory, or written as data at
        the wrong offset."""
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        announced = response.get("ContentLength")
        size = int(announced) if announced is not None else None
        problem = None
        if status == 206:
            match = _CONTENT_RANGE.fullmatch(str(response.get("ContentRange") or "").strip())
            if match is None:
                problem = f"a 206 answer without a valid Content-Range ({_short(response)})"
            else:
                first, last = int(match[1]), int(match[2])
                count = last - first + 1
                # Short only where the object ends, when the answer says where.
                short = match[3] != "*" and last != min(start + length, int(match[3])) - 1
                if first != start or not 0 < count <= length or size not in (None, count) or short:
                    problem = f"bytes {first}-{last} ({_short(response)})"
                size = count
        elif status == 200:
            if start != 0 or size is None or size > length:
                problem = f"status 200, the whole object ({size} bytes): the range was ignored"
        else:
            problem = f"status {status}"
        if problem is not None or size is None:
            response["Body"].close()  # unread: the connection is dropped
            raise StoreError(f"get_object {key}: asked bytes {start}-{start + length - 1} "
                             f"from {self.endpoint}, got {problem}")
        return size


def _wire(response: dict[str, Any]) -> Wire:
    """What carries the answer's body: the body's own account of it
    (s3_read_client.py's), else dug out of botocore's StreamingBody, the
    urllib3 response under it and http.client's under that."""
    body = response["Body"]
    if hasattr(body, "wire"):
        return body.wire()  # type: ignore[no-any-return]
    raw = getattr(body, "_raw_stream", None)
    return Wire(getattr(raw, "_fp", None),
                getattr(getattr(raw, "connection", None), "sock", None),
                bool(getattr(raw, "chunked", False)),
                getattr(raw, "release_conn", lambda: None))


def _splice_body(fp: http.client.HTTPResponse, sock: Any, fd: int, offset: int,
                 expected: int) -> tuple[int, int]:
    """(bytes written, of which spliced past http.client)."""
    # What http.client read past the headers is in its buffer (8 KiB;
    # read1 of more returns all of it, or reads the socket once when it is
    # empty): that part the usual way, then the socket.
    head = _read(fp.read1, min(expected, _CHUNK))
    pwrite_all(fd, head, offset)
    got = len(head)
    try:
        past = splice.socket_to_file(sock, fd, offset + got, expected - got)
    except splice.Refused as refused:
        # The rest is copied from the socket too: http.client's count of
        # what is left knows nothing of what was spliced.
        past = refused.moved + splice.socket_copy_to_file(
            sock, fd, offset + got + refused.moved, expected - got - refused.moved)
    return got + past, past


def _consumed(fp: http.client.HTTPResponse, past: int) -> bool:
    """Tell http.client that the `past` bytes it did not read went by, so it
    closes the response and the connection can serve the next GET (a new
    connection per range would leave a port in TIME_WAIT for each). False,
    the connection then closed, where its count is not what that implies."""
    if fp.length != past:
        return False
    fp.length = 0
    fp.read()  # nothing left: closes the response, not the socket
    return fp.isclosed()


def _read(read: Any, n: int) -> bytes:
    """`read(n)` of a response body, its failures as the connection's."""
    try:
        return bytes(read(n))
    except _body_errors() as err:
        raise splice.SocketFailed(type(err).__name__) from err


def _body_errors() -> tuple[type[BaseException], ...]:
    """What reading a body raises when its connection fails: urllib3's
    errors only where urllib3 is loaded (botocore's transport); a process
    that never imported it cannot meet them, and importing it would cost a
    restore that reads without botocore (s3_read_client.py) ~45 ms."""
    urllib3_errors = sys.modules.get("urllib3.exceptions")
    found: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException, BotoCoreError)
    return (*found, urllib3_errors.HTTPError) if urllib3_errors is not None else found


def _drop(body: Any, wire: Wire) -> None:
    """A body not read to its end: its connection closed, not reused, and
    its slot given back to the pool."""
    body.close()
    wire.release()


def _fill(readinto: Callable[[memoryview], int | None], view: memoryview) -> int:
    """Read into all of `view` unless the body ends first; how many bytes.
    The body's failures as SocketFailed."""
    filled = 0
    try:
        while filled < len(view):
            n = readinto(view[filled:])
            if not n:
                break
            filled += n
    except _body_errors() as err:
        raise splice.SocketFailed(type(err).__name__) from err
    return filled


def _reader(body: Any) -> Callable[[memoryview], int]:
    """readinto for a body that only reads (another transport)."""
    def readinto(view: memoryview) -> int:
        data = body.read(len(view))
        view[:len(data)] = data
        return len(data)
    return readinto


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
        pwrite_all(fd, chunk, offset + got)
        got += len(chunk)
    return got
