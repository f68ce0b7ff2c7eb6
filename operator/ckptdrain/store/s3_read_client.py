"""GetObject, HeadObject and ListObjectsV2 over http.client, signed by
sigv4.py: the reads of the s3:// store without botocore's client.

Why: a restore reads, and botocore's client cost each restore ~0.25 s of
CPU before its first request (importing botocore and urllib3, then loading
the S3 model, its endpoint rules and endpoints.json to build the client):
on every node of every restart, more than the rest of a small restore.
This client answers those three operations with what botocore's would
return (s3_read_answers.py) and fails with botocore's exception classes
(ClientError, EndpointConnectionError, ReadTimeoutError, SSLError...), so
the gate's retries, s3_errors.py's messages and the ranged reads treat it
exactly as botocore's. It sends what s3_read_settings.py allows and nothing
else: anything it does not serve (`serves`) is botocore's.

Connections: kept per host, newest first, at most the store's pool size;
one the server closed while idle is dropped before use (as urllib3 does).
A GET's connection comes back when its body is read to the end.
"""

from __future__ import annotations

import http.client
import os
import select
import socket
import ssl
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
    SSLError,
)

from ckptdrain import __version__
from ckptdrain.store import s3_read_answers, sigv4
from ckptdrain.store.s3_ranged_reads import Wire
from ckptdrain.store.s3_read_settings import ReadSettings, default_ca_file

#: botocore's operation name and the parameters this client takes, by method.
OPERATIONS = {
    "get_object": ("GetObject", frozenset({"Bucket", "Key", "Range"})),
    "head_object": ("HeadObject", frozenset({"Bucket", "Key"})),
    "list_objects_v2": ("ListObjectsV2",
                        frozenset({"Bucket", "Prefix", "MaxKeys", "ContinuationToken"})),
}
#: The most of an error answer's body read (S3's are a few hundred bytes).
_ERROR_BODY = 64 << 10
_USER_AGENT = f"ckptdrain/{__version__}"
#: Answers by which S3 names the bucket's region (botocore's redirector).
_WRONG_REGION = frozenset({"AuthorizationHeaderMalformed", "PermanentRedirect"})


class S3ReadClient:
    """The three reads of one custom endpoint, as ReadSettings say."""

    def __init__(self, endpoint_url: str, settings: ReadSettings, *, max_pool_connections: int,
                 connect_timeout: float, read_timeout: float) -> None:
        parts = urlsplit(endpoint_url)
        self._scheme = parts.scheme.lower()
        self._hostname = str(parts.hostname)
        self._port = parts.port or (443 if self._scheme == "https" else 80)
        self._explicit_port = parts.port is not None and parts.port != (
            443 if self._scheme == "https" else 80)
        self._base = parts.path.rstrip("/")
        self._settings = settings
        self._region = settings.region
        self._pool_size = max(1, max_pool_connections)
        self._timeouts = (connect_timeout, read_timeout)
        self._pools: dict[str, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._tls: ssl.SSLContext | None = None

    @staticmethod
    def serves(op: str, params: dict[str, Any]) -> bool:
        """Whether `op` with these parameters is one this client sends."""
        known = OPERATIONS.get(op)
        return known is not None and params.keys() <= known[1]

    # The operations, called as botocore's client methods are ---------------------
    def get_object(self, *, Bucket: str, Key: str, Range: str | None = None) -> dict[str, Any]:
        headers = {"Range": Range} if Range is not None else {}
        return self._call("get_object", Bucket, Key, [], headers)

    def head_object(self, *, Bucket: str, Key: str) -> dict[str, Any]:
        return self._call("head_object", Bucket, Key, [], {})

    def list_objects_v2(self, *, Bucket: str, Prefix: str | None = None,
                        MaxKeys: int | None = None,
                        ContinuationToken: str | None = None) -> dict[str, Any]:
        query = [("list-type", "2"), ("encoding-type", "url")]
        for name, value in (("prefix", Prefix), ("max-keys", MaxKeys),
                            ("continuation-token", ContinuationToken)):
            if value is not None:
                query.append((name, str(value)))
        return self._call("list_objects_v2", Bucket, None, query, {})

    # Requests -------------------------------------------------------------------------
    def _call(self, op: str, bucket: str, key: str | None, query: list[tuple[str, str]],
              headers: dict[str, str]) -> dict[str, Any]:
        """Send, and once more signed for the bucket's region where the answer
        names another (botocore's region redirect). Only this request is
        re-signed: the client's region stays, so one stray answer (a proxy, a
        misrouted node) cannot re-sign every later request of the process."""
        try:
            return self._send(op, bucket, key, query, headers, self._region)
        except ClientError as err:
            region = _named_region(err)
            if region is None or region == self._region:
                raise
        return self._send(op, bucket, key, query, headers, region)

    def _send(self, op: str, bucket: str, key: str | None, query: list[tuple[str, str]],
              headers: dict[str, str], region: str) -> dict[str, Any]:
        name = OPERATIONS[op][0]
        host, path = self._address(bucket, key)
        encoded = sigv4.query_string(query)
        method = "HEAD" if op == "head_object" else "GET"
        url = f"{self._scheme}://{host}{path}"
        signed = sigv4.sign(method, host, path, encoded, {**headers, "User-Agent": _USER_AGENT},
                            self._settings.credentials, region, datetime.now(UTC))
        target = f"{path}?{encoded}" if encoded else path
        connection, reused = self._connection(host, url)
        try:
            try:
                connection.request(method, target, headers=signed)
                response = connection.getresponse()
            except ConnectionError:
                if not reused:
                    raise
                # An idle connection the server closed just as it was taken
                # (no byte of an answer came): the request again, on a new
                # one. GET and HEAD may be repeated; read as congestion, the
                # race would pause every request of the process.
                connection.close()
                connection, _ = self._connection(host, url, fresh=True)
                connection.request(method, target, headers=signed)
                response = connection.getresponse()
        except (OSError, http.client.HTTPException) as err:
            connection.close()
            raise _transport_error(err, url, connecting=False) from err
        answer = {k.lower(): v for k, v in response.getheaders()}
        if not 200 <= response.status < 300:
            body = _read_some(response)  # HEAD: none, and the answer is closed
            self._finish(host, connection, response)
            raise ClientError(s3_read_answers.error_answer(  # type: ignore[arg-type]
                response.status, response.reason, answer, body), name)
        if op == "get_object" and "content-length" not in answer and not response.chunked:
            # Without a length or chunks, EOF is all that ends the body, and a
            # connection cut short would read as a whole object: refuse it as
            # a body that did not all come (S3 always sends a length).
            connection.close()
            raise ResponseStreamingError(error=http.client.IncompleteRead(b""))
        if op == "get_object":
            fields = s3_read_answers.object_answer(response.status, answer)
            fields["Body"] = ObjectBody(
                response, connection, url, fields.get("ContentLength"),
                lambda reusable: self._finish(host, connection, response, reusable))
            return fields
        body = _read_all(response, url)
        self._finish(host, connection, response)
        if op == "head_object":
            return s3_read_answers.object_answer(response.status, answer)
        try:
            return s3_read_answers.list_answer(response.status, answer, body)
        except ValueError as err:
            raise ResponseStreamingError(error=err) from None

    def _address(self, bucket: str, key: str | None) -> tuple[str, str]:
        """(Host header, percent-encoded path) of a request, as botocore
        builds them for this addressing style."""
        hostname = f"[{self._hostname}]" if ":" in self._hostname else self._hostname
        if self._settings.virtual:
            hostname = f"{bucket}.{hostname}"
            path = f"{self._base}/{key or ''}"
        else:
            path = f"{self._base}/{bucket}" + (f"/{key}" if key is not None else "")
        host = f"{hostname}:{self._port}" if self._explicit_port else hostname
        return host, sigv4.quote_path(path)

    # Connections ----------------------------------------------------------------------
    def _connection(self, host: str, url: str,
                    fresh: bool = False) -> tuple[http.client.HTTPConnection, bool]:
        """(An idle connection to `host` the server has not closed, else a new
        one; whether it was idle). `fresh`: a new one."""
        with self._lock:
            idle = self._pools.setdefault(host, [])
            while idle and not fresh:
                connection = idle.pop()
                if not _dropped(connection):
                    return connection, True
                connection.close()
        connect, read = self._timeouts
        target = host.rsplit(":", 1)[0] if self._explicit_port else host
        target = target.strip("[]")
        if self._scheme == "https":
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                target, self._port, timeout=connect, context=self._tls_context(url))
        else:
            connection = http.client.HTTPConnection(target, self._port, timeout=connect)
        try:
            connection.connect()
        except (OSError, http.client.HTTPException) as err:
            connection.close()
            raise _transport_error(err, url, connecting=True) from err
        sock = connection.sock
        sock.settimeout(read)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # botocore's tcp_keepalive
        return connection, False

    def _tls_context(self, url: str) -> ssl.SSLContext:
        """The trust botocore's urllib3 would build: a CA directory as capath,
        a file as cafile; one that cannot be loaded fails as botocore's
        SSLError (urllib3 wraps the same failure so), not a raw OSError."""
        with self._lock:
            if self._tls is None:
                ca = self._settings.ca_file or default_ca_file()
                try:
                    self._tls = ssl.create_default_context(capath=ca) if os.path.isdir(ca) \
                        else ssl.create_default_context(cafile=ca)
                except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
                    raise SSLError(endpoint_url=url, error=err) from err
            return self._tls

    def _finish(self, host: str, connection: http.client.HTTPConnection,
                response: http.client.HTTPResponse, reusable: bool = True) -> None:
        """The connection back to the pool when its answer was read to the
        end (and `reusable`: all of it came) and the server keeps it open;
        else closed."""
        if not reusable or not response.isclosed() or response.will_close:
            connection.close()
            return
        with self._lock:
            idle = self._pools.setdefault(host, [])
            if len(idle) < self._pool_size:
                idle.append(connection)
                return
        connection.close()


class ObjectBody:
    """GetObject's Body, read as botocore's StreamingBody reads: failures
    as ReadTimeoutError or ResponseStreamingError, a body shorter than its
    Content-Length as IncompleteReadError. Its connection goes back to the
    pool once the body is read to the end (as urllib3 gives it back), and
    is closed when the body is closed unread or cut short."""

    def __init__(self, response: http.client.HTTPResponse,
                 connection: http.client.HTTPConnection, url: str, length: int | None,
                 finish: Callable[[bool], None]) -> None:
        self._response = response
        self._connection = connection
        self._url = url
        self._length = length
        self._got = 0
        self._finish = finish
        self._done = False

    def read(self, amt: int | None = None) -> bytes:
        try:
            chunk = self._response.read(amt)
        except TimeoutError as err:
            self._end(reusable=False)
            raise ReadTimeoutError(endpoint_url=self._url, error=err) from err
        except (OSError, http.client.HTTPException) as err:
            self._end(reusable=False)
            raise ResponseStreamingError(error=err) from err
        self._got += len(chunk)
        if amt is None or (not chunk and amt > 0) or self._response.isclosed():
            whole = self._length is None or self._got == self._length
            self._end(reusable=whole)
            if not whole and (amt is None or not chunk):
                raise IncompleteReadError(actual_bytes=self._got, expected_bytes=self._length)
        return chunk

    def wire(self) -> Wire:
        """The answer's http.client response and socket, for reads that go
        past this body (s3_ranged_reads.py); its `release` says the body was
        read to its end there."""
        return Wire(self._response, self._connection.sock, bool(self._response.chunked),
                    lambda: self._end(reusable=True))

    def close(self) -> None:
        self._end(reusable=False)  # unless read to the end before: then already back

    def _end(self, *, reusable: bool) -> None:
        if not self._done:
            self._done = True
            self._finish(reusable)

    def __enter__(self) -> ObjectBody:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _dropped(connection: http.client.HTTPConnection) -> bool:
    """Whether an idle connection was closed by the server: readable with
    no request in flight means end of stream (or bytes nobody asked for)."""
    if connection.sock is None:
        return True
    poller = select.poll()
    poller.register(connection.sock, select.POLLIN)
    return bool(poller.poll(0))


def _transport_error(err: BaseException, url: str, *, connecting: bool) -> Exception:
    """botocore's exception for what the connection raised (httpsession.py's mapping)."""
    if isinstance(err, ssl.SSLError | ssl.CertificateError):
        return SSLError(endpoint_url=url, error=err)
    if isinstance(err, TimeoutError):
        return (ConnectTimeoutError if connecting else ReadTimeoutError)(endpoint_url=url,
                                                                        error=err)
    if connecting:
        return EndpointConnectionError(endpoint_url=url, error=err)
    return ConnectionClosedError(endpoint_url=url, error=err)


def _read_all(response: http.client.HTTPResponse, url: str) -> bytes:
    try:
        return response.read()
    except (OSError, http.client.HTTPException) as err:
        raise _transport_error(err, url, connecting=False) from err


def _read_some(response: http.client.HTTPResponse) -> bytes:
    """Up to _ERROR_BODY bytes of an error's body (the rest, if any, left:
    the connection is then closed, not reused)."""
    try:
        return response.read(_ERROR_BODY)
    except (OSError, http.client.HTTPException):
        return b""  # the status says what went wrong; the connection is closed


def _named_region(err: ClientError) -> str | None:
    """The bucket's region where an answer says the request was signed for
    another (a 301 or one of _WRONG_REGION, naming it in x-amz-bucket-region
    or <Region>). Where it names none, botocore would go on to ask
    HeadBucket; this client reports the error as it came."""
    error = err.response.get("Error", {})
    meta = err.response.get("ResponseMetadata", {})
    if meta.get("HTTPStatusCode") not in (301, 302, 307) and error.get("Code") not in \
            _WRONG_REGION and not (error.get("Code") in ("301", "400")
                                   and err.operation_name == "HeadObject"):
        return None
    region = meta.get("HTTPHeaders", {}).get("x-amz-bucket-region") or error.get("Region")
    return str(region) if region else None
