"""A real GCS JSON API server for tests: fake-gcs-server on 127.0.0.1.

    with start_fake_gcs(tmp_dir) as server:
        bucket = server.create_bucket()
        store = server.open_store(bucket)

Built by e2e/deps/fake-gcs.sh (`make servers`); a missing binary is an error
naming that target. It speaks plain http, so the store asks it anonymously
(no bearer token ever goes over http). What it does not do as GCS does, and
the tests therefore cannot show here: it does not check a CRC32C sent with
an upload (the store checks the one it reports back instead), ignores
`ifGenerationMatch`, does not page listings, and ignores storage classes.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tests.support.s3servers import START_TIMEOUT, _running, cache_dir, free_port

from ckptdrain.store.gcs import GcsStore

VERSION = "v1.52.2"


def fake_gcs_binary() -> Path:
    path = cache_dir() / "fake-gcs" / VERSION / "bin" / "fake-gcs-server"
    if not path.exists():
        raise RuntimeError(f"fake-gcs-server not found at {path}: run `make servers` "
                           "(it builds it with e2e/deps/fake-gcs.sh)")
    return path


@dataclass
class GcsServer:
    name: str
    endpoint_url: str
    workdir: Path
    process: Any = field(repr=False)
    _buckets: int = 0

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.endpoint_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
        return json.loads(text) if text.strip() else None

    def create_bucket(self, name: str | None = None) -> str:
        if name is None:
            self._buckets += 1
            name = f"t{self._buckets:04d}-{secrets.token_hex(4)}"
        self._call("POST", "/storage/v1/b", {"name": name})
        return name

    def delete_prefix(self, bucket: str, prefix: str) -> None:
        listed = self._call("GET", f"/storage/v1/b/{bucket}/o?prefix={quote(prefix, safe='')}")
        for item in (listed or {}).get("items", []):
            try:
                self._call("DELETE", f"/storage/v1/b/{bucket}/o/{quote(item['name'], safe='')}")
            except urllib.error.HTTPError as err:
                if err.code != 404:
                    raise

    def open_store(self, bucket: str, prefix: str = "", **options: Any) -> GcsStore:
        return GcsStore(bucket, prefix, endpoint_url=self.endpoint_url, environ={}, **options)


def _wait_ready(server: GcsServer) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    last: object = None
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            log = (server.workdir / "fake-gcs.log").read_text(errors="replace")[-4000:]
            raise RuntimeError(f"fake-gcs-server exited with {server.process.returncode}:\n"
                               f"{log}")
        try:
            server._call("GET", "/storage/v1/b")
            return
        except (OSError, urllib.error.URLError) as err:
            last = err
        time.sleep(0.2)
    raise RuntimeError(f"fake-gcs-server not ready after {START_TIMEOUT:.0f} s ({last!r})")


@contextmanager
def start_fake_gcs(tmp_dir: Path) -> Iterator[GcsServer]:
    workdir = Path(tmp_dir) / "fake-gcs"
    (workdir / "data").mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = [str(fake_gcs_binary()), "-scheme", "http", "-host", "127.0.0.1",
            "-port", str(port), "-backend", "filesystem",
            "-filesystem-root", str(workdir / "data"),
            "-public-host", f"127.0.0.1:{port}", "-log-level", "warn"]
    with _running("fake-gcs", argv, {}, workdir) as process:
        server = GcsServer("gcs", f"http://127.0.0.1:{port}", workdir, process)
        _wait_ready(server)
        yield server
