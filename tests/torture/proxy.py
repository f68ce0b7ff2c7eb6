"""A loopback HTTP proxy in front of a real S3 server that counts upload bytes per key.

    proxy = CountingProxy("127.0.0.1", 8333); ... endpoint_url=proxy.endpoint_url
    proxy.resent  # {key: bytes uploaded to a key after an upload of it had completed}

It relays bytes unchanged (path-style requests, HTTP/1.1 keep-alive,
`Expect: 100-continue`, chunked bodies) and watches both directions: a key is
*finished* once a PutObject or CompleteMultipartUpload of it got a 2xx answer,
whether or not the client lived to read that answer. Body bytes sent to a
finished key later are a re-send. `stop()` closes every connection.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
from collections import Counter
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

_CHUNK = 1 << 16


def _headers(stream: BinaryIO) -> tuple[bytes, list[bytes], dict[str, str]] | None:
    """(raw head, first line split, lower-cased headers) or None at EOF."""
    first = stream.readline()
    while first in (b"\r\n", b"\n"):
        first = stream.readline()
    if not first:
        return None
    raw, fields = [first], {}
    while True:
        line = stream.readline()
        if not line:
            return None
        raw.append(line)
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        fields[name.strip().lower()] = value.strip()
    return b"".join(raw), first.split(b" ", 2), fields


def _relay_body(src: BinaryIO, dst: socket.socket, fields: dict[str, str],
                until_eof: bool = False) -> int:
    """Copy one message body; return its payload size."""
    total = 0
    if "chunked" in fields.get("transfer-encoding", "").lower():
        while True:
            size_line = src.readline()
            dst.sendall(size_line)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    line = src.readline()
                    dst.sendall(line)
                    if line in (b"\r\n", b"\n", b""):
                        return total
            data = src.read(size + 2)
            dst.sendall(data)
            total += size
    left = int(fields.get("content-length", "0") or 0)
    if until_eof and "content-length" not in fields:
        left = -1
    while left != 0:
        data = src.read1(_CHUNK if left < 0 else min(left, _CHUNK))  # type: ignore[attr-defined]
        if not data:
            break
        dst.sendall(data)
        total += len(data)
        if left > 0:
            left -= len(data)
    return total


class CountingProxy:
    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint_url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.sent: Counter[str] = Counter()
        self.resent: Counter[str] = Counter()
        self.finished: set[str] = set()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def reset(self) -> None:
        with self._lock:
            self.sent.clear()
            self.resent.clear()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, server]
            pending: queue.Queue[tuple[str, str, str]] = queue.Queue()
            threading.Thread(target=self._requests, args=(client, server, pending),
                             daemon=True).start()
            threading.Thread(target=self._responses, args=(server, client, pending),
                             daemon=True).start()

    @staticmethod
    def _key(target: str) -> tuple[str, str]:
        parts = urlsplit(target)
        path = unquote(parts.path).lstrip("/")
        return (path.split("/", 1)[1] if "/" in path else ""), parts.query

    def _requests(self, client: socket.socket, server: socket.socket,
                  pending: queue.Queue[tuple[str, str, str]]) -> None:
        stream = client.makefile("rb")
        with contextlib.suppress(OSError, ValueError):
            while True:
                head = _headers(stream)
                if head is None:
                    break
                raw, first, fields = head
                method = first[0].decode("latin-1")
                key, query = self._key(first[1].decode("latin-1") if len(first) > 1 else "/")
                pending.put((method, key, query))
                server.sendall(raw)
                with self._lock:
                    already = key in self.finished
                size = _relay_body(stream, server, fields)
                if method in ("PUT", "POST") and size:
                    with self._lock:
                        self.sent[key] += size
                        if already and method == "PUT":
                            self.resent[key] += size
        self._close(client, server)

    def _responses(self, server: socket.socket, client: socket.socket,
                   pending: queue.Queue[tuple[str, str, str]]) -> None:
        stream = server.makefile("rb")
        with contextlib.suppress(OSError, ValueError, queue.Empty):
            while True:
                head = _headers(stream)
                if head is None:
                    break
                raw, first, fields = head
                client.sendall(raw)
                status = int(first[1]) if len(first) > 1 else 0
                if 100 <= status < 200:
                    continue
                method, key, query = pending.get(timeout=600)
                if method != "HEAD" and status not in (204, 304):
                    _relay_body(stream, client, fields, until_eof=True)
                done = (method == "PUT" and "partNumber" not in query) or (
                    method == "POST" and "uploadId" in query)
                if 200 <= status < 300 and done:
                    with self._lock:
                        self.finished.add(key)
        self._close(client, server)

    def _close(self, *socks: socket.socket) -> None:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def stop(self) -> None:
        self._stopped = True
        with contextlib.suppress(OSError):
            self.listener.close()
        with self._lock:
            socks = list(self._socks)
        self._close(*socks)
