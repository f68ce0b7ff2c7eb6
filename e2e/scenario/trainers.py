"""The two trainers the scenario can run, and what their pods say.

`torch`: `e2e/images/trainer/train.py`, a small real PyTorch trainer in its
own image (the full scenario, `make e2e`). `sim`: the demo's simulated trainer
(`python -m ckptdrain.demo.trainer --mode sim`), run from the project image
itself, so the short scenario needs no torch anywhere (`make e2e-short`).

Both keep the shared step clock and checkpoint the same steps on every writer
(lockstep, see docs/e2e.md). The scenario asserts in train.py's vocabulary;
`events()` turns each trainer's JSON lines into it:

    {"event": "fresh"}                  nothing restored
    {"event": "load", "step", "hash", "tier", "bytes", "restore_seconds",
                      "skipped", "source", "at"}
                                        fresh and load of `sim` also say its
                                        "role": "writer" or "reader"
    {"event": "resume", "step"}         the first step it trains
    {"event": "save", "step", "hash", "reason"}   reason "sigterm": emergency
    {"event": "sigterm", "step"}        SIGTERM arrived; `step` is the newest done
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

AGENT_EVENT = re.compile(r"checkpoint (\{.*\})$")
#: The agent's line when its share changes, e.g. "bandwidth share: 5.00 MB/s from …".
SHARE = re.compile(r"bandwidth share: ([0-9.]+) ?([kMGTP]?B)/s\b")
RATE_UNITS = {"B": 1.0, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "PB": 1e15}


class Trainer:
    """train.py: job.yaml is written for it, and the scenario speaks its vocabulary."""

    name = "torch"
    images: tuple[str, ...] = ("ckptdrain:dev", "ckptdrain-trainer:dev")

    def job(self, manifest: str, every: int, step_s: float, epoch: float,
            checkpoint_bytes: int) -> str:
        """The Job to apply, from job.yaml rendered for train.py."""
        return manifest

    def events(self, lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return lines


class SimTrainer(Trainer):
    """The demo's simulated trainer, from the project image."""

    name = "sim"
    images = ("ckptdrain:dev",)

    def job(self, manifest: str, every: int, step_s: float, epoch: float,
            checkpoint_bytes: int) -> str:
        job = yaml.safe_load(manifest)
        pod = job["spec"]["template"]["spec"]
        pod["volumes"] = [v for v in pod.get("volumes", []) if v["name"] != "torch"]
        (container,) = [c for c in pod["containers"] if c["name"] == "trainer"]
        container.pop("volumeMounts", None)
        container.pop("env", None)
        container["image"] = "docker.io/library/ckptdrain:dev"
        # Exit 143 after the emergency checkpoint, like train.py: the pod was
        # interrupted, not finished, so the Job runs the index again.
        container["command"] = [
            "python3", "-m", "ckptdrain.demo.trainer", "--mode", "sim",
            "--size", str(checkpoint_bytes), "--shards", "2", "--digest",
            "--step-time", str(step_s), "--clock", f"{epoch:.3f}", "--every", str(every),
            "--preempted-exit", "143"]
        return json.dumps(job)

    def events(self, lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for e in lines:
            if e.get("event") == "start":
                if e.get("restored") is None:
                    out.append({"event": "fresh", "at": e["t"], "role": e.get("role")})
                else:
                    # No digest (a trainer run without --digest) fails loudly here
                    # rather than comparing None with None.
                    out.append({"event": "load", "step": e["restored"], "hash": e["digest"],
                                "at": e["t"], **{k: e.get(k) for k in (
                                    "tier", "bytes", "restore_seconds", "skipped", "source",
                                    "role")}})
                out.append({"event": "resume", "step": e["from_step"], "at": e["t"]})
            elif e.get("event") == "sigterm":
                out.append({"event": "sigterm", "step": e["step"], "at": e["t"]})
            elif e.get("event") == "saved":
                out.append({"event": "save", "step": e["step"], "hash": e["digest"],
                            "reason": "sigterm" if e.get("emergency") else e.get("reason"),
                            "at": e["t"]})
        return out


TRAINERS: dict[str, Trainer] = {t.name: t for t in (Trainer(), SimTrainer())}


class Logs:
    """`kubectl logs -f` of each trainer and agent container, into files, so that
    a deleted pod's last words are kept."""

    def __init__(self, directory: Path, namespace: str, trainer: Trainer) -> None:
        self.dir, self.namespace, self.kind = directory, namespace, trainer
        self.dir.mkdir(parents=True, exist_ok=True)
        self.following: set[tuple[str, str]] = set()
        self.procs: list[subprocess.Popen[bytes]] = []

    def follow(self, pod: str) -> None:
        for container in ("trainer", "ckptdrain-agent", "ckptdrain-restore"):
            if (pod, container) in self.following:
                continue
            self.following.add((pod, container))
            cmd = [os.environ.get("KUBECTL", "kubectl"), "logs", "-f", "-n", self.namespace,
                   pod, "-c", container]
            with open(self.dir / f"{pod}.{container}.log", "wb") as out:
                self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT))

    def refollow(self, pod: str) -> None:
        """Follow the pod's containers again, from their first line: `kubectl
        logs -f` streams through kubelet, and ends when kubelet stops (the
        containers' own log files, which kubelet only reads, miss nothing)."""
        for proc in self.procs:
            if proc.poll() is None and pod in proc.args:
                proc.terminate()
                proc.wait()
        self.following = {(p, c) for p, c in self.following if p != pod}
        self.follow(pod)

    def trainer(self, pod: str) -> list[dict[str, Any]]:
        return self.kind.events(_json_lines(self.dir / f"{pod}.trainer.log"))

    def agent(self, pod: str) -> list[dict[str, Any]]:
        events = []
        path = self.dir / f"{pod}.ckptdrain-agent.log"
        for doc in _json_lines(path):  # the agent logs one JSON object a line
            match = AGENT_EVENT.match(str(doc.get("msg", "")))
            if match:
                events.append(json.loads(match[1]))
        return events

    def share_during(self, pod: str, start: float, end: float) -> float | None:
        """The largest bandwidth share (bytes/s) the pod's agent had in [start, end]:
        the one in force at `start` and any it was given until `end`."""
        changes = []
        for doc in _json_lines(self.dir / f"{pod}.ckptdrain-agent.log"):
            match = SHARE.match(str(doc.get("msg", "")))
            if match and isinstance(doc.get("t"), (int, float)):
                changes.append((float(doc["t"]), float(match[1]) * RATE_UNITS[match[2]]))
        before = [rate for t, rate in sorted(changes) if t <= start][-1:]
        during = [rate for t, rate in changes if start < t <= end]
        return max(before + during, default=None)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()


def _json_lines(path: Path) -> list[dict[str, Any]]:
    events = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    return events
