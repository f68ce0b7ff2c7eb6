"""Several processes of one pod under the demo launcher, as the short e2e
scenario runs them: one writer whose every step holds each process's files,
published once; on SIGTERM every process saves the one step the launcher
names, so the pod's emergency step is whole; each restores its own files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ckptdrain.demo.processes import emergency_step

EVERY, PROCESSES = 5, 2


def launch(work: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "CKPTDRAIN_WORK_DIR": str(work)}
    clock = time.time()
    return subprocess.Popen(
        [sys.executable, "-m", "ckptdrain.demo.processes", "--processes", str(PROCESSES),
         "--clock", f"{clock:.3f}", "--step-time", "0.05", "--",
         sys.executable, "-m", "ckptdrain.demo.trainer", "--mode", "sim", "--size", "64KiB",
         "--shards", "2", "--step-time", "0.05", "--clock", f"{clock:.3f}", "--digest",
         "--every", str(EVERY), "--preempted-exit", "143", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_until(work: Path, step: int) -> tuple[int, list[dict[str, Any]]]:
    proc = launch(work)
    deadline = time.monotonic() + 60
    while not (work / f"step-{step}").is_dir():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    time.sleep(0.12)  # mid-interval: the emergency step is a new one
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    return proc.returncode, [json.loads(x) for x in out.splitlines() if x.startswith("{")]


def test_the_emergency_step_is_the_one_after_the_running_step() -> None:
    assert emergency_step(100.0, 0.5, 100.0 + 0.5 * 7 + 0.2) == 8
    assert emergency_step(None, 0.5, 1e9) == -1


def test_every_step_holds_every_process_and_sigterm_saves_one_step(tmp_path: Path) -> None:
    code, found = run_until(tmp_path, 2 * EVERY)
    assert code == 143
    saved = [e for e in found if e["event"] == "saved"]
    by_step: dict[int, set[int]] = {}
    for e in saved:
        by_step.setdefault(e["step"], set()).add(e["process"])
    emergency = {e["process"]: e["step"] for e in saved if e.get("emergency")}
    assert len(emergency) == PROCESSES and len(set(emergency.values())) == 1, emergency
    for step, processes in by_step.items():
        assert processes == set(range(PROCESSES)), (step, processes)
        names = sorted(p.name for p in (tmp_path / f"step-{step}").iterdir())
        assert names == sorted(f"p{p}-{n}" for p in range(PROCESSES)
                               for n in ("shard-000.bin", "shard-001.bin", "state.json"))
    assert not list(tmp_path.glob("step-*.tmp*")), "no save left half-done"

    # A new pod start: restore placed the emergency step; every process loads
    # its own files, with the digest it saved them with.
    step = next(iter(emergency.values()))
    (tmp_path / "restore.json").write_text(json.dumps({
        "fresh_start": False, "step": step, "tier": "local", "bytes": 1, "seconds": 0.1,
        "path": str(tmp_path / f"step-{step}")}))
    for newer in tmp_path.glob("step-*"):
        if int(newer.name.split("-")[1]) > step:
            for f in newer.iterdir():
                f.unlink()
            newer.rmdir()
    proc = launch(tmp_path, "--max-steps", str(step + 2))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    starts = {e["process"]: e for e in map(json.loads, out.splitlines()) if e["event"] == "start"}
    digests = {e["process"]: e["digest"] for e in saved if e["step"] == step}
    assert sorted(starts) == list(range(PROCESSES))
    for p, e in starts.items():
        assert e["restored"] == step and e["from_step"] == step + 1
        assert e["digest"] == digests[p]
