"""The operator's side of the admission process (admission_process.py):
start it, restart it when it dies, turn its reports into the operator's
webhook metrics, and tell Kopf where it serves.

Kopf still knows the webhooks (webhook.py registers them), so that where it
manages the webhook configurations itself it describes them as before; the
server it is given here serves nothing itself: it yields the address and CA
the admission process serves with, again whenever the CA file changes.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any

from ckptdrain.operator import metrics, webhook_tls
from ckptdrain.operator.admission_process import READY, REPORT
from ckptdrain.operator.config import OperatorConfig

#: Waits before starting it again after it died, growing with each quick death.
RESTART_S = (0.5, 1.0, 2.0, 5.0, 10.0)
#: A process that lived this long was healthy: the next death starts the waits anew.
HEALTHY_S = 60.0


def command(files: tuple[str, str, str | None]) -> list[str]:
    cert, key, _ = files
    return [sys.executable, "-m", "ckptdrain.operator.admission_process",
            "--cert", cert, "--key", key]


def observe(line: str) -> bool:
    """Record one report line in the webhook metrics; False if it is not one."""
    parts = line.split()
    if len(parts) != 4 or parts[0] != REPORT:
        return False
    try:
        seconds = float(parts[3])
    except ValueError:
        return False
    metrics.WEBHOOK_SECONDS.labels(parts[1], parts[2]).observe(seconds)
    return True


class Supervisor:
    """Keeps one admission process running while the operator runs."""

    def __init__(self, files: tuple[str, str, str | None], logger: logging.Logger) -> None:
        self.files, self.logger = files, logger
        self.process: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        #: Set once a process listens (it says so on its standard output).
        self.ready = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="ckptdrain-admission", daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()

    def _run(self) -> None:
        quick_deaths = 0
        while not self._stopping.is_set():
            began = time.monotonic()
            # Its standard input is ours to hold: it leaves when we are gone.
            self.process = subprocess.Popen(command(self.files), stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE)
            assert self.process.stdout is not None
            self._read_reports(self.process.stdout)
            code = self.process.wait()
            if self._stopping.is_set():
                return
            quick_deaths = 0 if time.monotonic() - began > HEALTHY_S else quick_deaths + 1
            delay = RESTART_S[min(quick_deaths, len(RESTART_S)) - 1] if quick_deaths else 0.0
            self.logger.error("the admission process exited (%s); starting it again in %.1fs",
                              code, delay)
            self._stopping.wait(delay)

    def _read_reports(self, out: IO[bytes]) -> None:
        for raw in out:
            line = raw.decode(errors="replace").strip()
            if line == READY:
                self.ready.set()
            elif line and not observe(line):
                self.logger.info("admission: %s", line)


class RemoteServer:
    """What Kopf takes for a webhook server: the client configuration of the
    admission process's (URL and CA bundle), yielded once it listens (where
    Kopf registers the webhooks itself, no request finds nobody there), and
    again when the CA changes."""

    def __init__(self, cfg: OperatorConfig, ca: str | None,
                 ready: threading.Event | None = None) -> None:
        self.cfg, self.ca = cfg, ca
        self.ready = ready

    def url(self) -> str:
        host = self.cfg.webhook_host
        netloc = f"[{host}]" if ":" in host else host
        return f"https://{netloc}:{self.cfg.webhook_port}"

    async def __call__(self, fn: Any) -> AsyncIterator[dict[str, Any]]:
        del fn  # the admission process serves; nothing is served here
        while self.ready is not None and not self.ready.is_set():
            await asyncio.sleep(0.1)
        while True:
            cadata = Path(self.ca).read_bytes() if self.ca else None
            config: dict[str, Any] = {"url": self.url()}
            if cadata is not None:
                config["caBundle"] = base64.b64encode(cadata).decode("ascii")
            yield config
            digest = hashlib.sha256(cadata or b"").digest()
            while cadata is not None and hashlib.sha256(
                    Path(self.ca or "").read_bytes()).digest() == digest:
                await asyncio.sleep(webhook_tls.CHECK_S)
            if cadata is None:
                await asyncio.Event().wait()  # nothing to follow


def start(cfg: OperatorConfig, files: tuple[str, str, str | None],
          logger: logging.Logger) -> RemoteServer:
    """Start the admission process and return the server Kopf is to be given."""
    supervisor = Supervisor(files, logger)
    supervisor.start()
    return RemoteServer(cfg, files[2], supervisor.ready)
