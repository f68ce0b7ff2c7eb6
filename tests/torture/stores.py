"""The stores a sweep runs against, and raw access to their objects.

    kind = StoreKind.start("seaweedfs", scratch, stack)   # or "file", "minio", "gcs"
    area = kind.area("kills")        # a fresh prefix (S3, GCS) or directory (file://)
    area.uri, area.env               # what the CLI and the agent are given
    area.get(key) / put / delete / keys(prefix)   # bypassing ckptdrain, to corrupt

An S3 kind owns its server (tests/support/s3servers.py launchers) and can kill,
restart, freeze and thaw it for the outage category. The gcs kind owns a GCS
API server (tests/support/gcsserver.py), reached as the emulator it is
(STORAGE_EMULATOR_HOST), its objects read and written through the JSON API.
Everything listens on 127.0.0.1 and stops when the sweep's ExitStack closes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from tests.support.gcsserver import GcsServer, start_fake_gcs
from tests.support.s3servers import S3Server, start_minio, start_seaweedfs
from tests.torture.proxy import CountingProxy

RESTART_CAP = 90.0


def _reserved(key: str) -> bool:
    return any(part.startswith(".ckptdrain-") for part in key.split("/"))


_STEP_DATA = re.compile(r"data/(?:[0-9a-f]{2}/)?(?P<step>[0-9]{20})/")


@dataclass
class Area:
    """One store area: `uri` and the environment a process needs to reach it."""

    kind: StoreKind
    uri: str
    env: dict[str, str]
    root: Path | None = None  # file://
    prefix: str = ""  # s3://
    endpoint: str = ""

    def _full(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def keys(self, prefix: str = "") -> dict[str, int]:
        """{key: size} of every object under `prefix` (ckptdrain's reserved names hidden)."""
        if self.root is not None:
            found = {}
            for dirpath, dirs, names in os.walk(self.root):
                dirs[:] = [d for d in dirs if not d.startswith(".ckptdrain-")]
                for name in names:
                    if name.startswith(".ckptdrain-"):
                        continue
                    key = str((Path(dirpath) / name).relative_to(self.root))
                    if key.startswith(prefix):
                        found[key] = (Path(dirpath) / name).stat().st_size
            return found
        if self.kind.gcs is not None:
            return {k[len(self._full("")):]: size
                    for k, size in self.kind.gcs_list(self._full(prefix)).items()
                    if not _reserved(k[len(self._full("")):])}
        client, found = self.kind.client(), {}
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=self.kind.bucket, Prefix=self._full(prefix))
        for page in pages:
            for item in page.get("Contents", []):
                found[item["Key"][len(self._full("")):]] = item["Size"]
        return found

    def step_data_keys(self, step: int) -> dict[str, int]:
        """{key: size} of every writer's data of `step`, in both layouts
        (data/<step>/... and the spread data/<xx>/<step>/..., docs/store-layout.md)."""
        return {k: size for k, size in self.keys("data/").items()
                if _STEP_DATA.match(k) and int(_STEP_DATA.match(k)["step"]) == step}

    def get(self, key: str) -> bytes:
        if self.root is not None:
            return (self.root / key).read_bytes()
        if self.kind.gcs is not None:
            return self.kind.gcs_request("GET", f"/storage/v1/b/{self.kind.bucket}/o/"
                                         f"{quote(self._full(key), safe='')}?alt=media")
        body = self.kind.client().get_object(Bucket=self.kind.bucket, Key=self._full(key))
        return bytes(body["Body"].read())

    def put(self, key: str, data: bytes) -> None:
        if self.root is not None:
            path = self.root / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            return
        if self.kind.gcs is not None:
            self.kind.gcs_request("POST", f"/upload/storage/v1/b/{self.kind.bucket}/o?"
                                  f"uploadType=media&name={quote(self._full(key), safe='')}",
                                  data)
            return
        self.kind.client().put_object(Bucket=self.kind.bucket, Key=self._full(key), Body=data)

    def delete(self, key: str) -> None:
        if self.root is not None:
            (self.root / key).unlink(missing_ok=True)
            return
        if self.kind.gcs is not None:
            with contextlib.suppress(FileNotFoundError):
                self.kind.gcs_request("DELETE", f"/storage/v1/b/{self.kind.bucket}/o/"
                                      f"{quote(self._full(key), safe='')}")
            return
        self.kind.client().delete_object(Bucket=self.kind.bucket, Key=self._full(key))

    def identity(self, key: str) -> tuple[int, int] | None:
        """(inode, mtime) of a file:// object: a rewrite changes it. None on S3."""
        if self.root is None:
            return None
        st = (self.root / key).stat()
        return st.st_ino, st.st_mtime_ns

    def proxied(self) -> tuple[Area, CountingProxy | None]:
        """The same area reached through a counting proxy (S3, GCS), or itself (file://)."""
        if self.kind.gcs is not None:
            parts = urlsplit(self.kind.gcs.endpoint_url)
            proxy = CountingProxy(parts.hostname or "127.0.0.1", parts.port or 80)
            self.kind.proxies.append(proxy)
            host = urlsplit(proxy.endpoint_url).netloc
            return Area(self.kind, self.uri, {**self.env, "STORAGE_EMULATOR_HOST": host},
                        None, self.prefix, proxy.endpoint_url), proxy
        if self.root is not None or self.kind.server is None:
            return self, None
        parts = urlsplit(self.kind.server.endpoint_url)
        proxy = CountingProxy(parts.hostname or "127.0.0.1", parts.port or 80)
        self.kind.proxies.append(proxy)
        env = {**self.env, "CKPTDRAIN_S3_ENDPOINT": proxy.endpoint_url,
               "AWS_ENDPOINT_URL": proxy.endpoint_url}
        return Area(self.kind, self.uri, env, None, self.prefix, proxy.endpoint_url), proxy


@dataclass
class StoreKind:
    name: str
    scratch: Path
    server: S3Server | None = None
    gcs: GcsServer | None = None
    bucket: str = ""
    proxies: list[CountingProxy] = field(default_factory=list)
    restarted: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _client: Any = None

    @classmethod
    def start(cls, name: str, scratch: Path, stack: contextlib.ExitStack) -> StoreKind:
        scratch.mkdir(parents=True, exist_ok=True)
        if name == "file":
            (scratch / "stores").mkdir(exist_ok=True)
            return cls(name, scratch)
        if name == "gcs":
            gcs = stack.enter_context(start_fake_gcs(scratch))
            kind = cls(name, scratch, gcs=gcs)
            stack.callback(kind.close)
            kind.bucket = gcs.create_bucket()
            return kind
        launcher = {"seaweedfs": start_seaweedfs, "minio": start_minio}[name]
        server = stack.enter_context(launcher(scratch))
        kind = cls(name, scratch, server)
        stack.callback(kind.close)
        kind.bucket = server.create_bucket()
        return kind

    @property
    def is_file(self) -> bool:
        return self.server is None and self.gcs is None

    @property
    def is_s3(self) -> bool:
        return self.server is not None

    def client(self) -> Any:
        if self._client is None:
            assert self.server is not None
            self._client = self.server.client(read_timeout=30, connect_timeout=3)
        return self._client

    def gcs_request(self, method: str, path: str, data: bytes | None = None) -> bytes:
        """One JSON API call to the GCS server, its body; FileNotFoundError on a 404."""
        assert self.gcs is not None
        request = urllib.request.Request(self.gcs.endpoint_url + path, data=data,
                                         method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as err:
            if err.code == 404:
                raise FileNotFoundError(path) from None
            raise

    def gcs_list(self, prefix: str) -> dict[str, int]:
        """{name: size} of every object of the bucket under `prefix`, paged."""
        found, token = {}, ""
        while True:
            query = f"?prefix={quote(prefix, safe='')}" + (
                f"&pageToken={quote(token, safe='')}" if token else "")
            page = json.loads(self.gcs_request("GET", f"/storage/v1/b/{self.bucket}/o{query}")
                              or b"{}")
            found.update({item["name"]: int(item["size"]) for item in page.get("items", [])})
            token = page.get("nextPageToken") or ""
            if not token:
                return found

    def area(self, label: str) -> Area:
        tag = f"{label}-{uuid.uuid4().hex[:8]}"
        if self.gcs is not None:
            host = urlsplit(self.gcs.endpoint_url).netloc
            return Area(self, f"gs://{self.bucket}/{tag}", {"STORAGE_EMULATOR_HOST": host},
                        prefix=tag, endpoint=self.gcs.endpoint_url)
        if self.server is None:
            root = self.scratch / "stores" / tag
            root.mkdir(parents=True, exist_ok=True)  # a volume: ls and restore need it there
            return Area(self, f"file://{root}", {}, root=root)
        s = self.server
        env = {"CKPTDRAIN_S3_ENDPOINT": s.endpoint_url, "AWS_ENDPOINT_URL": s.endpoint_url,
               "AWS_ACCESS_KEY_ID": s.access_key, "AWS_SECRET_ACCESS_KEY": s.secret_key,
               "AWS_REGION": s.region}
        return Area(self, f"s3://{self.bucket}/{tag}", env, prefix=tag, endpoint=s.endpoint_url)

    # -- outages (S3 only) -------------------------------------------------------------
    def _pid(self) -> int:
        assert self.server is not None
        return self.server.process.pid

    def kill_server(self) -> None:
        assert self.server is not None
        self.server.process.kill()
        self.server.process.wait(30)
        self._client = None

    def freeze(self) -> None:
        os.kill(self._pid(), signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self._pid(), signal.SIGCONT)

    def restart_server(self) -> None:
        """Start the killed server again on the same ports and data; wait until it serves."""
        assert self.server is not None
        s = self.server
        env = dict(os.environ)
        if s.name == "minio":
            env.update(MINIO_ROOT_USER=s.access_key, MINIO_ROOT_PASSWORD=s.secret_key,
                       MINIO_BROWSER="off", MINIO_UPDATE="off", MINIO_CI_CD="1")
        for sock in ("filer.sock", "s3.sock"):
            (s.workdir / sock).unlink(missing_ok=True)
        with s.log_path.open("ab") as log:
            proc = subprocess.Popen(s.process.args, cwd=s.workdir, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.restarted.append(proc)
        s.process = proc
        deadline = time.monotonic() + RESTART_CAP
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{s.name} did not restart: {s.log_tail()}")
            with contextlib.suppress(Exception):
                client = s.client(connect_timeout=2, read_timeout=5)
                client.put_object(Bucket=self.bucket, Key="torture-ready", Body=b"ok")
                client.delete_object(Bucket=self.bucket, Key="torture-ready")
                self._client = None
                return
            time.sleep(0.3)
        raise RuntimeError(f"{s.name} not serving {RESTART_CAP:.0f} s after a restart")

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.stop()
        if self.server is not None:
            with contextlib.suppress(OSError):
                self.thaw()
        for proc in self.restarted:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
