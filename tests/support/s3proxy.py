"""A fault-injecting HTTP proxy in front of a REAL S3 server.

    with S3FaultProxy(server.endpoint_url) as proxy:
        store = S3Store(bucket, prefix, endpoint_url=proxy.url, ...)
        proxy.max_in_flight = 2        # a 3rd concurrent request gets 503 SlowDown
        proxy.throttle_next(5)         # the next 5 requests get 503 SlowDown
        proxy.throttle_next(3, status=429, code="TooManyRequests")
        proxy.stall_next(1)            # the next request is held, never answered
        proxy.stall_all = True         # every request is held until cleared
        ... run the code under test ...
        proxy.throttled, proxy.forwarded, proxy.peak_in_flight

Everything else is forwarded byte for byte (the Host header too, so the
SigV4 signature still matches), and the real server's answer returned.
A held request is released (its connection closed) when the proxy stops.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

_SLOWDOWN = ('<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
             "<Message>Please reduce your request rate.</Message></Error>")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


class S3FaultProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.lock = threading.Lock()
        self.released = threading.Event()
        self.max_in_flight: int | None = None
        self.stall_all = False
        self.in_flight = self.peak_in_flight = 0
        self.throttled = self.forwarded = self.stalled = 0
        #: In-flight counts seen by each request when it arrived, in order.
        self.arrivals: list[int] = []
        self._throttle: list[tuple[int, str]] = []
        self._stall = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> S3FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def throttle_next(self, n: int, status: int = 503, code: str = "SlowDown") -> None:
        with self.lock:
            self._throttle.extend([(status, code)] * n)

    def stall_next(self, n: int) -> None:
        with self.lock:
            self._stall += n

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        with self.lock:
            self.arrivals.append(self.in_flight)
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            fault: tuple[int, str] | None = None
            stall = self.stall_all
            if self._stall:
                self._stall, stall = self._stall - 1, True
            elif self._throttle:
                fault = self._throttle.pop(0)
            elif self.max_in_flight is not None and self.in_flight > self.max_in_flight:
                fault = (503, "SlowDown")
            if fault:
                self.throttled += 1
            if stall:
                self.stalled += 1
        done = False

        def finished() -> None:
            # Counted out before the answer is written, as a server would: a
            # client that sends its next request the moment it has the answer
            # must not find this one still "in flight".
            nonlocal done
            if not done:
                done = True
                with self.lock:
                    self.in_flight -= 1

        try:
            if stall:
                self.released.wait()  # never answered while the test runs
                h.close_connection = True
                return
            if fault is not None:
                finished()
                payload = _SLOWDOWN.format(code=fault[1]).encode()
                h.send_response(fault[0])
                h.send_header("Content-Type", "application/xml")
                h.send_header("Content-Length", str(len(payload)))
                h.end_headers()
                if h.command != "HEAD":
                    h.wfile.write(payload)
                return
            self._forward(h, body, finished)
        finally:
            finished()

    def _forward(self, h: BaseHTTPRequestHandler, body: bytes,
                 finished: Callable[[], None]) -> None:
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP}
            conn.request(h.command, h.path, body=body or None, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
            with self.lock:
                self.forwarded += 1
            finished()
            h.send_response(answer.status, answer.reason)
            for k, v in answer.getheaders():
                # A HEAD's Content-Length is the object's size: passed on as it is.
                if k.lower() not in _HOP and (k.lower() != "content-length" or not data):
                    h.send_header(k, v)
            if data:
                h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(data)
        finally:
            conn.close()
