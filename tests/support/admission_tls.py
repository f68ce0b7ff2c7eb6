"""The admission process's HTTPS server in the test's own process, on a free
port with a throw-away certificate: for tests of its HTTP edge (bodies,
methods, connections, /convert) without an apiserver in front; and what
those tests send and wait on."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import certificates as admission_certificates
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission import server as admission_server
from ckptdrain.operator.admission.policy_mirror import PolicyMirror


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate and key for 127.0.0.1, valid a day."""
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


@contextmanager
def serving(directory: Path, cfg: config.OperatorConfig,
            reviewer: admission_process.Reviewer) -> Iterator[tuple[admission_server.Server, Path]]:
    """`reviewer` served over TLS (its converter at cfg.conversion_path) until
    exit; yields the server and the certificate to trust."""
    cert, key = self_signed(directory)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    server = admission_server.Server(("127.0.0.1", 0), admission_certificates.Certificates(
        str(cert), str(key)), reviewer, loop, converter=reviewer.convert,
        conversion_path=cfg.conversion_path)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server, cert
    finally:
        server.shutdown()
        server.server_close()
        loop.call_soon_threadsafe(loop.stop)


#: The chart's webhook timeoutSeconds: how long the apiserver waits.
APISERVER_WAIT_S = 5.0


@dataclass
class Served:
    """A server `serving` and how to reach it."""
    server: admission_server.Server
    port: int
    context: ssl.SSLContext

    def bare(self) -> socket.socket:
        """A TCP connection that never speaks TLS."""
        return socket.create_connection(("127.0.0.1", self.port))

    def tls(self) -> ssl.SSLSocket:
        """A connection whose TLS handshake is done, and nothing sent."""
        return self.context.wrap_socket(self.bare(), server_hostname="127.0.0.1")

    def https(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context,
                                           timeout=APISERVER_WAIT_S)

    def until_a_connection_waits(self, waits: bool = True) -> None:
        """Until a new connection waits for a connection slot (`waits`), or
        none does; a failure after 20 s (the server's threads are this
        process's)."""
        deadline = time.monotonic() + 20
        while self.server.connection_slots.waiting != waits:
            assert time.monotonic() < deadline, f"waiting for a slot is not {waits} in 20 s"
            time.sleep(0.01)


@contextmanager
def served_with_slots(directory: Path, cfg: config.OperatorConfig, slots: int,
                      monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """The real server (`serving`), its connection slots cut to `slots`."""
    monkeypatch.setattr(admission_server, "MAX_CONNECTIONS", slots)
    with serving(directory, cfg, admission_process.Reviewer(cfg, PolicyMirror())) as (server, cert):
        yield Served(server, server.server_address[1],
                     ssl.create_default_context(cafile=str(cert)))


class Readers:
    """How many connections are reading a body (in Handler._read_body: a
    large body's slot is held by then), for a test to wait on rather than
    sleep for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count, self.changed = 0, threading.Condition()
        read = admission_server.Handler._read_body

        def counted(handler: admission_server.Handler, length: int, began: float,
                    deadline: float) -> bytes:
            self._add(1)
            try:
                return read(handler, length, began, deadline)
            finally:
                self._add(-1)

        monkeypatch.setattr(admission_server.Handler, "_read_body", counted)

    def _add(self, step: int) -> None:
        with self.changed:
            self.count += step
            self.changed.notify_all()

    def wait_for(self, wanted: int) -> None:
        """Until `wanted` bodies are being read; a failure after 20 s, well
        within the trickled bodies' own wait (30 s)."""
        with self.changed:
            reached = self.changed.wait_for(lambda: self.count >= wanted, 20)
            assert reached, f"{self.count} of {wanted} bodies being read after 20 s"


def valid_review(conn: http.client.HTTPSConnection, uid: str,
                 query: str = "?timeout=2s") -> tuple[int, Any]:
    """A pod review no policy selects sent on `conn`: its status and answer."""
    conn.request("POST", f"/{admission.MUTATE_ID}{query}", body=json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "operation": "CREATE", "namespace": "ml",
                    "object": {"metadata": {"name": "p"}, "spec": {"containers": [
                        {"name": "c", "image": "i"}]}}}}).encode(),
        headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def allowed(uid: str) -> tuple[int, Any]:
    """What `valid_review` is answered."""
    return 200, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                 "response": {"uid": uid, "allowed": True}}
