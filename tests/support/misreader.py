"""A loopback S3 front that answers GETs wrongly, from a REAL server's objects.

    with Misreader(server, mode="ignore-range") as front:
        store = S3Store(bucket, prefix, endpoint_url=front.endpoint_url, ...)

Every GET the front receives is answered from the real server's object (read
with the server's own client and credentials), in one of these ways:

- "honest": the range asked for, 206 with its Content-Range (or the whole
  object, 200, when no range was asked): what a correct server does.
- "ignore-range": 200 with the whole object, Range or not (a server or proxy
  without range support).
- "shift": 206 with the range one byte further on and a Content-Range that
  says so truthfully (an answer about other bytes).
- "short": 206 with the first half of the range asked, its Content-Range
  saying so (an answer that stops before the object's end).
- "chunked": the honest status and Content-Range, but the whole object as a
  chunked body with no Content-Length (a body longer than announced).
- "cut": the honest answer's status and headers, then half its body and
  the connection closed (a server or proxy that dies mid-body).
- "stall": the same half, then nothing, the connection held open until the
  front stops (a body that stops coming without an error).

Only GET is served; the tests write through the real server directly.
Objects are read from the server once and kept (tests measure the memory
the reader allocates, in this same process: the front's must not count).
`sent` counts the body bytes the front managed to hand to the socket,
`connections` the connections it accepted.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from tests.support.s3servers import S3Server

MODES = ("honest", "ignore-range", "shift", "short", "chunked", "cut", "stall")
_RANGE = re.compile(r"bytes=(\d+)-(\d+)")
_CHUNK = 1 << 16


class Misreader:
    def __init__(self, server: S3Server, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        self.mode = mode
        self.sent = 0
        self.connections = 0
        self._client = server.client()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._objects: dict[tuple[str, str], bytes] = {}
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def setup(self) -> None:  # one call per connection accepted
                super().setup()
                with front._lock:
                    front.connections += 1

            def do_GET(self) -> None:  # http.server calls it by this name
                with contextlib.suppress(OSError):
                    front._answer(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._httpd.handle_error = lambda *args: None  # type: ignore[method-assign]  # resets: the point
        self.endpoint_url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def __enter__(self) -> Misreader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def _answer(self, h: BaseHTTPRequestHandler) -> None:
        bucket, _, key = unquote(urlsplit(h.path).path).lstrip("/").partition("/")
        with self._lock:  # read once: tests measure the reader's memory, not ours
            whole = self._objects.get((bucket, key))
        if whole is None:
            whole = self._client.get_object(Bucket=bucket, Key=key)["Body"].read()
            with self._lock:
                self._objects[(bucket, key)] = whole
        asked = _RANGE.fullmatch(h.headers.get("Range", ""))
        status, headers, body = 200, {}, whole
        if asked and self.mode != "ignore-range":
            first, last = int(asked[1]), int(asked[2])
            if self.mode == "shift":
                first, last = first + 1, last + 1
            if self.mode == "short":
                last = first + (last - first) // 2
            last = min(last, len(whole) - 1)
            status, body = 206, whole[first:last + 1]
            headers["Content-Range"] = f"bytes {first}-{last}/{len(whole)}"
        h.send_response(status)
        for name, value in headers.items():
            h.send_header(name, value)
        if self.mode == "chunked":
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            for at in range(0, len(whole), _CHUNK):
                piece = whole[at:at + _CHUNK]
                h.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self._count(len(piece))
            h.wfile.write(b"0\r\n\r\n")
            return
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        end = len(body) // 2 if self.mode in ("cut", "stall") else len(body)
        for at in range(0, end, _CHUNK):
            h.wfile.write(body[at:min(at + _CHUNK, end)])
            self._count(len(body[at:min(at + _CHUNK, end)]))
        h.wfile.flush()
        if self.mode == "cut":
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
        elif self.mode == "stall":
            self._stopping.wait(60)

    def _count(self, n: int) -> None:
        with self._lock:
            self.sent += n
