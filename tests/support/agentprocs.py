"""Run the real agent, trainer and restore as processes, the way a pod would.

    pod = Pod(tmp_path, store_env={...})
    agent = pod.start_agent(); trainer = pod.start_trainer()
    pod.wait_for(lambda: pod.local_steps())
    pod.sigterm(trainer, agent)

Waits poll for a condition with a generous cap (a loaded CI machine is slow)
and fail with the processes' logs; they never assert on how long anything took.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ckptdrain.node.localtier import LocalTier

T = TypeVar("T")
WAIT_CAP = 120.0


class Pod:
    def __init__(
        self,
        root: Path,
        *,
        store_env: dict[str, str] | None = None,
        interval: str = "0.5s",
        grace: str = "20",
        size: str = "8MiB",
        rate: str = "1GB/s",
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        self.work, self.local = root / "work", root / "local"
        self.events = root / "events.jsonl"
        self.share = root / "share" / "bandwidth"
        self.share.parent.mkdir(parents=True, exist_ok=True)
        self.size = size
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.env = dict(os.environ)
        self.env.update(store_env or {})
        uri = self.env.get("CKPTDRAIN_STORE_URI", "")
        if uri.startswith("file://"):
            # A pod's file:// store is a mounted volume: there before restore,
            # which takes a missing directory for a wrong path.
            Path(uri.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
        self.env.update(
            {
                "CKPTDRAIN_WORK_DIR": str(self.work),
                "CKPTDRAIN_LOCAL_DIR": str(self.local),
                "CKPTDRAIN_INTERVAL": interval,
                "CKPTDRAIN_GRACE_SECONDS": grace,
                "CKPTDRAIN_SHARE_FILE": str(self.share),
                "CKPTDRAIN_DEFAULT_RATE": rate,
                "CKPTDRAIN_METRICS_PORT": "0",
                "CKPTDRAIN_PART_SIZE": "1MiB",
                "CKPTDRAIN_CONCURRENCY": "4",
                "CKPTDRAIN_LOCAL_KEEP": "2",
                "PYTHONUNBUFFERED": "1",
            }
        )
        self.env.update(extra_env or {})

    @property
    def tier(self) -> LocalTier:
        return LocalTier(self.local)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = self.root / f"{name}-{len(self.procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", *argv], env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        self.procs.append((name, proc, log))
        return proc

    def start_agent(self, *args: str, wait: bool = True) -> subprocess.Popen[bytes]:
        """Start the agent; with `wait`, return once it runs its loop (so a test's
        SIGTERM exercises the flush, not start-up)."""
        proc = self._spawn(
            "agent", ["ckptdrain.agent.command", "--events", str(self.events), *args]
        )
        log = self.procs[-1][2]
        if wait:
            self.wait_for(
                lambda: "agent started" in log.read_text(errors="replace"), "the agent to start"
            )
        return proc

    def start_trainer(self, *args: str) -> subprocess.Popen[bytes]:
        return self._spawn(
            "trainer",
            [
                "ckptdrain.demo.trainer",
                "--mode",
                "sim",
                "--size",
                self.size,
                "--shards",
                "2",
                "--step-time",
                "0.05",
                *args,
            ],
        )

    def restore(self) -> tuple[int, dict[str, Any]]:
        proc = subprocess.run(
            [sys.executable, "-m", "ckptdrain.restore.command"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=WAIT_CAP,
        )
        result_file = self.work / "restore.json"
        doc = json.loads(result_file.read_text()) if result_file.exists() else {}
        doc["_stdout"], doc["_stderr"] = proc.stdout, proc.stderr
        return proc.returncode, doc

    def trainer_lines(self, proc: subprocess.Popen[bytes]) -> list[dict[str, Any]]:
        log = next(path for _, p, path in self.procs if p is proc)
        docs = []
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                docs.append(json.loads(line))
        return docs

    def event_list(self) -> list[dict[str, Any]]:
        if not self.events.exists():
            return []
        return [json.loads(line) for line in self.events.read_text().splitlines() if line]

    def states(self, state: str) -> list[int]:
        return [e["step"] for e in self.event_list() if e["state"] == state]

    def logs(self) -> str:
        parts = []
        for name, _, path in self.procs:
            text = path.read_text(errors="replace") if path.exists() else ""
            parts.append(f"--- {name} ({path}) ---\n{text[-3000:]}")
        return "\n".join(parts)

    def wait_for(self, condition: Callable[[], T], what: str, cap: float = WAIT_CAP) -> T:
        deadline = time.monotonic() + cap
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            for name, proc, _ in self.procs:
                if proc.poll() is not None and proc.returncode != 0:
                    raise AssertionError(
                        f"{name} died ({proc.returncode}) waiting for {what}\n" + self.logs()
                    )
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}\n" + self.logs())

    def sigterm(self, *procs: subprocess.Popen[bytes], timeout: float = WAIT_CAP) -> list[int]:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        return [proc.wait(timeout) for proc in procs]

    def stop_all(self) -> None:
        for _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
