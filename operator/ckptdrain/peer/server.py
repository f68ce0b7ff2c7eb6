"""The agent's peer server: a thin HTTPS edge over the partner area.

    PUT /v1/copies/<writer>/<step>   receive a copy stream (201 new, 200 already held)
    GET /v1/copies/<writer>          {"steps": [...]} served for writer, newest first
                                     (copies held for it; its own local steps when it
                                     is this agent's writer)
    GET /v1/copies/<writer>/<step>   the copy stream of a held step
    GET .../<step>/manifest          its manifest alone
    GET .../<step>/files/<i>         file i of that manifest (a Range: bytes=a-b part)

Every connection does the TLS handshake in its own thread (a slow or hostile
client cannot stall the accept loop), within HANDSHAKE_TIMEOUT, and must
present this policy's certificate (peer/tls.py). At most MAX_CONNECTIONS are
served at once: a connection over that is closed before its handshake, so
nothing that has not proved anything can hold more than that many threads
(a client turned away falls back to the next tier). Refusals answer one line
of text saying why. `listen_address` listens on IPv6 and IPv4 where the
node has IPv6, so pods of either family reach it.
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ckptdrain.errors import CkptdrainError, IntegrityError, InvalidInput
from ckptdrain.manifest import WriterManifest
from ckptdrain.node.durable import CopyAborted
from ckptdrain.peer import protocol, stream
from ckptdrain.peer.area import PartnerArea
from ckptdrain.peer.protocol import PeerRefused
from ckptdrain.peer.tls import PeerAuthError, PeerCredentials

log = logging.getLogger(__name__)

#: Seconds a connection may sit idle between requests before it is dropped.
IDLE_TIMEOUT = 60.0
#: Seconds a new connection has to complete its TLS handshake.
HANDSHAKE_TIMEOUT = 10.0
#: Connections served at once: a partner's push, restores (four each) and
#: DCP readers of its copies, with room to spare.
MAX_CONNECTIONS = 128


def listen_address(port: int) -> tuple[str, int]:
    """Every address of the node: IPv6 and IPv4 (one dual-stack socket) where
    the kernel has IPv6, IPv4 alone where it does not."""
    if socket.has_ipv6:
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
                probe.bind(("::", 0))
            return "::", port
        except OSError:
            pass
    return "0.0.0.0", port


class PeerServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], area: PartnerArea,
                 credentials: PeerCredentials, *,
                 max_connections: int = MAX_CONNECTIONS,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT) -> None:
        self.area = area
        self.credentials = credentials
        credentials.server_context()  # fails now, not at the first connection
        self.received_bytes = 0
        self.handshake_timeout = handshake_timeout
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self.turned_away = 0
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            # One socket for both families (Linux may default to v6 only).
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def get_request(self) -> tuple[socket.socket, object]:
        sock, addr = self.socket.accept()
        # Without it, the last segment of every answer waits for the client's
        # delayed ACK (Nagle): 40 ms per part of a restore read in parts.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.handshake_timeout)
        # Per connection: a renewed certificate is served without a restart.
        try:
            context = self.credentials.server_context()
        except (ssl.SSLError, InvalidInput) as error:
            # No certificate loads: turn this one away, keep serving (the
            # server loop survives an OSError from here only).
            sock.close()
            raise OSError(f"peer credentials: {error}") from None
        tls = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return tls, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.turned_away += 1
            log.warning("peer connection from %s turned away: %d connections already "
                        "served", client_address[0], self.max_connections)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: object, client_address: object) -> None:
        err = sys.exc_info()[1]
        if isinstance(err, OSError):  # a refused handshake or a peer that went away
            log.info("peer connection from %s ended: %s", client_address, err)
        else:
            log.exception("peer request from %s failed", client_address)

    @property
    def port(self) -> int:
        return self.server_address[1]

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="peer-server", daemon=True)
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: PeerServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        try:
            self.request.do_handshake()
            self.server.credentials.check_peer(self.request)
        except (ssl.SSLError, OSError, PeerAuthError) as err:
            log.warning("peer connection from %s refused: %s", self.client_address[0], err)
            self.request.close()
            raise ConnectionAbortedError(str(err)) from None
        self.request.settimeout(IDLE_TIMEOUT)
        super().setup()

    def log_message(self, fmt: str, *args: object) -> None:
        log.debug("peer %s: " + fmt, self.client_address[0], *args)

    def _answer(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self, err: CkptdrainError) -> None:
        status = err.status if isinstance(err, PeerRefused) else 422
        log.warning("peer request %s %s refused: %s", self.command, self.path[:80], err)
        self.close_connection = True  # the rest of a refused body is not read
        self._answer(status, (str(err)[:400] + "\n").encode())

    def do_PUT(self) -> None:
        try:
            target = protocol.parse_target(self.path, self.server.area.writers)
            if not target.whole:
                raise PeerRefused(405, "PUT needs /v1/copies/<writer>/<step>")
            length = _content_length(self.headers.get("Content-Length"))
            new = self.server.area.receive(target, self.rfile, length)
        except (CkptdrainError, CopyAborted) as err:
            self._refuse(err if isinstance(err, CkptdrainError) else PeerRefused(503, str(err)))
            return
        if new:
            self.server.received_bytes += length
        self._answer(201 if new else 200, b"published\n" if new else b"already held\n")

    def do_GET(self) -> None:
        try:
            target = protocol.parse_target(self.path, self.server.area.writers)
            area = self.server.area
            if target.step is None:
                body = json.dumps({"steps": area.served_steps(target.writer)}).encode()
                self._answer(200, body, "application/json")
                return
            tier = area.source(target.writer, target.step)
            if tier is None:
                raise PeerRefused(404, f"no copy of writer {target.writer} "
                                       f"step {target.step}")
            data, manifest = stream.read_copy(tier.step_dir(target.step))
            if target.manifest:
                self._answer(200, data, "application/json")
                return
            if target.file is not None:
                self._send_file(tier.step_dir(target.step), manifest, target.file)
                return
        except (CkptdrainError, OSError) as err:
            self._refuse(err if isinstance(err, CkptdrainError) else IntegrityError(str(err)))
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length",
                         str(protocol.stream_length(manifest, len(data))))
        self.end_headers()
        self._stream(target, lambda: stream.send_copy(tier.step_dir(target.step), manifest,
                                                      data, self.wfile.write))

    def _send_file(self, step_dir: Path, manifest: WriterManifest, index: int) -> None:
        """File `index` of the manifest, or the part `Range` asks for (206)."""
        if index >= len(manifest.files):
            raise PeerRefused(404, f"file {index} of a step of {len(manifest.files)} files")
        entry = manifest.files[index]
        ranged = self.headers.get("Range")
        start, end = protocol.parse_range(ranged, entry.size)
        self.send_response(206 if ranged is not None else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        if ranged is not None:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{entry.size}")
        self.end_headers()
        target = protocol.Target(manifest.writer, manifest.step, index)
        self._stream(target, lambda: stream.send_range(step_dir, entry, start, end,
                                                       self.wfile.write))

    def _stream(self, target: protocol.Target, send: Callable[[], None]) -> None:
        try:
            send()
        except (OSError, IntegrityError) as err:
            # Headers are gone: cutting the connection is the only honest answer,
            # and the client's length and CRC32C checks catch it.
            log.warning("sending writer %d step %s%s failed: %s", target.writer, target.step,
                        "" if target.file is None else f" file {target.file}", err)
            self.close_connection = True


def _content_length(value: str | None) -> int:
    length = protocol.content_length(value)
    if length is None:
        raise PeerRefused(411, f"Content-Length must be a whole number, got {value!r:.40}")
    return length
