"""peer/parts.py against a partner gone wrong (plain HTTP on loopback: what is
tested is what the reader does with the answers, not TLS): a Content-Length
Python cannot parse, a wrong one, and one span failing while the others are
slow. Every failure is a CkptdrainError or an OSError (restore's fallbacks
catch those), and comes without waiting for the other spans."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ckptdrain import checksum
from ckptdrain.errors import CkptdrainError
from ckptdrain.manifest import WriterManifest
from ckptdrain.peer import parts

SIZE = 4 << 20
DATA = bytes(range(256)) * (SIZE // 256)


class Partner:
    """What the fake partner answers for file 0, and how slow it is for the others."""

    def __init__(self) -> None:
        self.first_length: str | None = None
        self.others_delay = 0.0


@pytest.fixture
def partner() -> Iterator[tuple[Partner, int]]:
    behaviour = Partner()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            index = int(self.path.rsplit("/", 1)[1])
            first, last = map(int, self.headers["Range"].split("=")[1].split("-"))
            n = min(last + 1, SIZE) - first
            self.send_response(206)
            if index == 0 and behaviour.first_length is not None:
                self.send_header("Content-Length", behaviour.first_length)
                self.end_headers()
                return
            self.send_header("Content-Length", str(n))
            self.end_headers()
            time.sleep(behaviour.others_delay)
            with contextlib.suppress(OSError):  # the reader hung up: what the test wants
                self.wfile.write(DATA[first:first + n])

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield behaviour, server.server_port
    server.shutdown()
    server.server_close()


def _manifest(files: int) -> WriterManifest:
    crc = checksum.to_hex(checksum.crc32c(DATA))
    return WriterManifest.from_json(json.dumps({
        "format": 1, "step": 5, "writer": 0, "writers": 1, "created": 1.0,
        "files": [{"path": f"f{i}", "size": SIZE, "crc32c": crc} for i in range(files)],
    }).encode())


def _connect(port: int) -> parts.Connect:
    return lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # type: ignore[return-value]


def test_a_well_behaved_partner_is_read_and_verified(partner: tuple[Partner, int],
                                                     tmp_path: Path) -> None:
    _, port = partner
    targets = parts.read_parts(_connect(port), "p", _manifest(3), tmp_path / "data", 3)
    assert [t.read_bytes() == DATA for t in targets] == [True] * 3


@pytest.mark.parametrize("length", ["1" * 5000, "12", "-1", "４"])
def test_a_content_length_other_than_the_part_is_refused(
        partner: tuple[Partner, int], tmp_path: Path, length: str) -> None:
    behaviour, port = partner
    behaviour.first_length = length
    with pytest.raises((CkptdrainError, OSError)):
        parts.read_parts(_connect(port), "p", _manifest(1), tmp_path / "data", 1)


def test_one_span_failing_stops_the_others(partner: tuple[Partner, int],
                                           tmp_path: Path) -> None:
    behaviour, port = partner
    behaviour.first_length = "12"  # file 0 fails at once
    behaviour.others_delay = 5.0  # the other spans wait on a slow partner
    began = time.monotonic()
    with pytest.raises(CkptdrainError):
        parts.read_parts(_connect(port), "p", _manifest(4), tmp_path / "data", 4)
    assert time.monotonic() - began < 2.5, "restore waited for spans of a copy already refused"
