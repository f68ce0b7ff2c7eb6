"""The quickstart's check Job runs its trainer with the command it names:
that command, run here as the pod would run it (faster steps, fewer of
them), checkpoints on its schedule, and on SIGTERM writes an emergency
checkpoint and exits with the code the Job's podFailurePolicy ignores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml
from tests.docs.blocks import REPO

JOB = yaml.safe_load((REPO / "docs" / "examples" / "quickstart" / "job.yaml").read_text())
(TRAINER,) = [c for c in JOB["spec"]["template"]["spec"]["containers"] if c["name"] == "trainer"]


def command(**overrides: str) -> list[str]:
    """The container's command with this interpreter, some flags' values replaced."""
    argv = list(TRAINER["command"])
    assert argv[:3] == ["python3", "-m", "ckptdrain.demo.trainer"], argv
    for flag, value in overrides.items():
        argv[argv.index(f"--{flag.replace('_', '-')}") + 1] = value
    return [sys.executable, *argv[1:]]


def env(tmp_path: Path) -> dict[str, str]:
    # What the webhook gives a trainer container (docs/pod-contract.md).
    work = tmp_path / "work"
    return {**os.environ, "CKPTDRAIN_WORK_DIR": str(work),
            "CKPTDRAIN_RESTORE_RESULT": str(work / "restore.json"),
            "CKPTDRAIN_WRITER_ID": "0", "CKPTDRAIN_WRITERS": "2",
            "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO)])}


def events(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_it_checkpoints_on_its_schedule(tmp_path: Path) -> None:
    result = subprocess.run(command(step_time="0.005", max_steps="250"), env=env(tmp_path),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    saved = [e["step"] for e in events(result.stdout) if e["event"] == "saved"]
    assert saved == [0, 100, 200], saved


def test_sigterm_saves_and_exits_with_the_ignored_code(tmp_path: Path) -> None:
    rules = JOB["spec"]["podFailurePolicy"]["rules"]
    ignored = next(r["onExitCodes"]["values"] for r in rules if "onExitCodes" in r)
    proc = subprocess.Popen(command(step_time="0.01"), env=env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if '"progress"' in line and json.loads(line)["step"] >= 20:
                break
            assert time.monotonic() < deadline, seen
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode in ignored, (proc.returncode, err)
    emergency = [e for e in events(rest) if e["event"] == "saved" and e.get("emergency")]
    assert len(emergency) == 1, rest
    assert (tmp_path / "work" / f"step-{emergency[0]['step']}").is_dir()
