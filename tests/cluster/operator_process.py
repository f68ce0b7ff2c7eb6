"""The operator as a subprocess (`python -m ckptdrain.operator.main`), pointed
at the test cluster, serving its webhooks on 127.0.0.1 with a self-signed
certificate registered in webhook configurations it manages itself."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from support.apiserver import Cluster, free_port

WEBHOOK_NAME = "ckptdrain-test.ckptdrain.io"
#: Peak resident memory (KiB) of every operator process stopped, for the
#: summary that sizes the chart's requests (conftest prints it).
PEAK_RSS_KIB: list[int] = []
ALLOWED_ROOT = "/mnt/ckptdrain"


class OperatorProcess:
    def __init__(self, cluster: Cluster, workdir: Path, standalone: bool = True,
                 verbose: bool = True, **env: str) -> None:
        self.cluster, self.workdir, self.standalone = cluster, workdir, standalone
        #: Debug logging (every request) helps a failing test; a benchmark of
        #: the operator's own cost runs it as deployed, without.
        self.verbose = verbose
        self.health_port, self.metrics_port = free_port(), free_port()
        self.env = {
            **cluster.env(),
            "CKPTDRAIN_ALLOWED_ROOT": ALLOWED_ROOT,
            "CKPTDRAIN_WEBHOOK_HOST": "127.0.0.1", "CKPTDRAIN_WEBHOOK_ADDR": "127.0.0.1",
            "CKPTDRAIN_WEBHOOK_PORT": str(free_port()),
            "CKPTDRAIN_WEBHOOK_MANAGED": WEBHOOK_NAME,
            "CKPTDRAIN_METRICS_PORT": str(self.metrics_port),
            "CKPTDRAIN_HEALTH_PORT": str(self.health_port),
            "CKPTDRAIN_EXPIRED_TTL": "0",
            "CKPTDRAIN_WATCHDOG_PERIOD": "1s",
            "CKPTDRAIN_NAMESPACE_RECHECK_PERIOD": "1s",
            # A CRD flipped by a test's upgrade is migrated within a second.
            "CKPTDRAIN_STORAGE_CHECK_PERIOD": "1s",
            # One apiserver: a short settle, still waited for.
            "CKPTDRAIN_STORAGE_SETTLE": "2s",
            "CKPTDRAIN_IMAGE": "ckptdrain:test",
            # The peer tier's CAs: the apiserver makes this namespace itself.
            "CKPTDRAIN_PEER_CA_NAMESPACE": "default",
            **env,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log(self) -> Path:
        return self.workdir / f"operator-{self.starts}.log"

    def start(self, timeout_s: float = 60) -> None:
        self.starts += 1
        out = open(self.log, "wb")  # noqa: SIM115 -- closed by the child's exit
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ckptdrain.operator.main",
             *(["--verbose"] if self.verbose else []),
             *(["--standalone"] if self.standalone else [])],
            env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"operator exited {self.proc.returncode}:\n{self.tail()}")
            if self._healthy() and self._webhooks_registered() and self._listening():
                return
            time.sleep(0.3)
        raise TimeoutError(f"operator not ready in {timeout_s}s:\n{self.tail()}")

    def _healthy(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.health_port}/healthz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def _listening(self) -> bool:
        """This replica's webhook port accepts connections (its admission
        process may start after another replica registered the webhooks),
        as the chart's readiness probe asks."""
        try:
            socket.create_connection(
                ("127.0.0.1", int(self.env["CKPTDRAIN_WEBHOOK_PORT"])), timeout=2).close()
        except OSError:
            return False
        return True

    def _webhooks_registered(self) -> bool:
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            got = self.cluster.kubectl("get", kind, WEBHOOK_NAME, "-o", "json", check=False)
            if got.returncode != 0:
                return False
            hooks = json.loads(got.stdout).get("webhooks") or []
            if not hooks or not all(h["clientConfig"].get("caBundle") for h in hooks):
                return False
        return True

    def peak_rss_kib(self) -> int | None:
        """VmHWM of the running operator plus its admission process (Linux;
        the sum of each one's peak), or None."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        total = 0
        for pid in [self.proc.pid, *self.children()]:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            line = next((x for x in status.splitlines() if x.startswith("VmHWM:")), None)
            total += int(line.split()[1]) if line else 0
        return total or None

    def children(self) -> list[int]:
        """The operator's child processes (its admission process)."""
        if self.proc is None:
            return []
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                    found.append(int(stat.parent.name))
            except (OSError, IndexError, ValueError):
                continue
        return found

    def stop(self) -> None:
        peak = self.peak_rss_kib()
        if peak is not None:
            PEAK_RSS_KIB.append(peak)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            wait_or_kill(self.proc)
        self.proc = None

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())


def wait_or_kill(proc: subprocess.Popen[Any], grace_s: float = 20) -> None:
    """Wait for a process told to stop; killed if it has not within grace_s."""
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


os.environ.setdefault("PYTHONUNBUFFERED", "1")
