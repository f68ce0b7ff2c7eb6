"""The operator's side of the admission process (admission/process.py):
start it, restart it when it dies, turn its reports into the operator's
webhook metrics, and tell Kopf where it serves.

Kopf still knows the webhooks (admission/webhook.py registers them), so that where it
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

from ckptdrain.operator import metrics
from ckptdrain.operator.admission.process import ALIVE, HEARTBEAT_S, READY, REPORT
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.tls import webhook_certs as webhook_tls

#: Waits before starting it again after it died, growing with each quick death.
RESTART_S = (0.5, 1.0, 2.0, 5.0, 10.0)
#: A process that lived this long was healthy: the next death starts the waits anew.
HEALTHY_S = 60.0
#: A process silent this long (no heartbeat, no report) is stuck: it is
#: killed and started again.
SILENT_S = 6 * HEARTBEAT_S


def command(files: tuple[str, str, str | None]) -> list[str]:
    cert, key, _ = files
    return [sys.executable, "-m", "ckptdrain.operator.admission.process",
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
        self._heard = time.monotonic()

    def start(self) -> None:
        threading.Thread(target=self._run, name="ckptdrain-admission", daemon=True).start()
        threading.Thread(target=self._watch, name="ckptdrain-admission-watch",
                         daemon=True).start()

    def _watch(self) -> None:
        """Kill a process that fell silent (its event loop or threads stuck);
        _run starts another. A pause of our own (the operator's process
        stopped, starved) is not held against it: the clock starts again."""
        last_tick = time.monotonic()
        while not self._stopping.wait(1.0):
            now = time.monotonic()
            if now - last_tick > 5.0:
                self._heard = now
            last_tick = now
            process = self.process
            if (process is not None and process.poll() is None
                    and now - self._heard > SILENT_S):
                self.logger.error("the admission process has been silent for %.0fs; "
                                  "killing it", now - self._heard)
                process.kill()
                self._heard = now

    def stop(self) -> None:
        self._stopping.set()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()

    def _run(self) -> None:
        quick_deaths = 0
        while not self._stopping.is_set():
            began = self._heard = time.monotonic()
            try:
                # Its standard input is ours to hold: it leaves when we are gone.
                self.process = subprocess.Popen(command(self.files), stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE)
                assert self.process.stdout is not None
                self._read_reports(self.process.stdout)
                code: int | str = self.process.wait()
            except OSError as error:  # could not start it (no memory, no pids)
                code = repr(error)
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
            self._heard = time.monotonic()
            if line == READY:
                self.ready.set()
            elif line == ALIVE:
                continue
            elif line and not observe(line):
                self.logger.info("admission: %s", line)


class RemoteServer:
    """What Kopf takes for a webhook server: the client configuration of the
    admission process's (URL and CA bundle), yielded once it listens (where
    Kopf registers the webhooks itself, no request finds nobody there), and
    again when the CA changes."""

    def __init__(self, cfg: OperatorConfig, ca: str | None,
                 ready: threading.Event | None = None) -> None:
        """`ca`: the file of the CA that signed the serving certificate (the
        certificate itself when it is self-signed)."""
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
            cadata = self._read()
            config: dict[str, Any] = {"url": self.url()}
            if cadata is not None:
                config["caBundle"] = base64.b64encode(cadata).decode("ascii")
            yield config
            if self.ca is None:
                await asyncio.Event().wait()  # nothing to follow
            digest = hashlib.sha256(cadata or b"").digest()
            while True:
                await asyncio.sleep(webhook_tls.CHECK_S)
                now = self._read()
                if now is not None and hashlib.sha256(now).digest() != digest:
                    break

    def _read(self) -> bytes | None:
        """The CA's bytes; None when there is no file or it cannot be read
        now (a renewal mid-write: the next check reads it)."""
        if self.ca is None:
            return None
        try:
            return Path(self.ca).read_bytes()
        except OSError:
            return None


def start(cfg: OperatorConfig, files: tuple[str, str, str | None],
          logger: logging.Logger) -> RemoteServer:
    """Start the admission process and return the server Kopf is to be given."""
    supervisor = Supervisor(files, logger)
    supervisor.start()
    return RemoteServer(cfg, files[2] or files[0], supervisor.ready)
