"""The admission process's HTTPS server in the test's own process, on a free
port with a throw-away certificate: for tests of its HTTP edge (bodies,
methods, /convert) without an apiserver in front."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ckptdrain.operator import config
from ckptdrain.operator.admission import certificates as admission_certificates
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import server as admission_server


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
