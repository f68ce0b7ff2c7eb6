"""A receiver for MinIO's audit webhook in tests: an HTTP server on loopback
keeping each audit entry MinIO posts to it, and the MinIO settings that
send them there (MINIO_AUDIT_WEBHOOK_ENABLE_<ID>, ..._ENDPOINT_<ID>, as
internal/logger/config.go of the pinned MinIO names them; docs/audit.md)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: The audit target's id in MinIO's settings.
TARGET = "CKPTDRAIN"


class AuditReceiver:
    """The entries received so far, in the order they came."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._entries: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def minio_env(self) -> dict[str, str]:
        """The settings that make MinIO send every request's audit entry here."""
        return {f"MINIO_AUDIT_WEBHOOK_ENABLE_{TARGET}": "on",
                f"MINIO_AUDIT_WEBHOOK_ENDPOINT_{TARGET}": self.url}

    def add(self, body: bytes) -> None:
        # One JSON entry a line (several when MinIO batches them).
        found = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        with self._lock:
            self._entries += found

    def entries(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._entries)

    def refusals(self, access_key: str) -> list[dict[str, Any]]:
        """The requests signed with `access_key` that MinIO answered 403."""
        return [e for e in self.entries() if e.get("accessKey") == access_key
                and (e.get("api") or {}).get("statusCode") == 403]


@contextlib.contextmanager
def audit_receiver() -> Iterator[AuditReceiver]:
    """An AuditReceiver listening on 127.0.0.1 (a port of the kernel's
    choosing: it is bound before MinIO is told it) until the block ends."""
    receiver: AuditReceiver | None = None

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            assert receiver is not None
            receiver.add(body)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:  # entries carry request headers: keep quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = AuditReceiver(f"http://127.0.0.1:{server.server_address[1]}/")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
