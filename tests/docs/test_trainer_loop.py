"""The README's trainer loop, run as written with a SIGTERM at a chosen moment:
the emergency checkpoint is the last finished step, under its own number,
the process exits 143, and a restart resumes from the next step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.docs import blocks
from tests.docs.blocks import REPO

(LOOP,) = [b for b in blocks.parse(REPO / "README.md")
           if b.lang == "python" and "on_preemption" in b.text]

# Sends SIGTERM from inside the client at a given moment (`after_step` N:
# when step N is done; -1: before the loop), and prints the steps run.
HARNESS = '''
import atexit, json, os, signal, sys
from ckptdrain.client import Client
SIGTERM_AT = int(os.environ["SIGTERM_AT"])
steps_run = []
atexit.register(lambda: print(json.dumps({"steps_run": steps_run})))
done = Client.step_done
def step_done(self, step):
    steps_run.append(step)
    done(self, step)
    if step == SIGTERM_AT:
        os.kill(os.getpid(), signal.SIGTERM)
Client.step_done = step_done
restored = Client.restored
def restored_then_sigterm(self):
    if SIGTERM_AT == -1:
        os.kill(os.getpid(), signal.SIGTERM)
    return restored(self)
Client.restored = restored_then_sigterm
'''


def run_loop(tmp_path: Path, sigterm_at: int | None) -> tuple[int, list[int]]:
    script = tmp_path / "loop.py"
    script.write_text(HARNESS + LOOP.text)
    env = {**os.environ, "CKPTDRAIN_WORK_DIR": str(tmp_path / "work"),
           "SIGTERM_AT": str(-2 if sigterm_at is None else sigterm_at),
           "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO)])}
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=60)
    lines = [json.loads(x) for x in result.stdout.splitlines() if x.startswith("{")]
    assert lines, result.stderr
    return result.returncode, lines[-1]["steps_run"]


def published(tmp_path: Path) -> dict[int, int]:
    """step -> the step number saved inside it, for every published step."""
    work = tmp_path / "work"
    return {int(d.name.split("-")[1]): int.from_bytes((d / "model.bin").read_bytes(), "little")
            for d in work.glob("step-*") if not d.name.endswith(".tmp")}


def test_sigterm_mid_run_saves_the_finished_step_and_exits_143(tmp_path: Path) -> None:
    code, steps = run_loop(tmp_path, sigterm_at=7)
    assert code == 143
    assert steps == list(range(8))
    assert published(tmp_path) == {7: 7}


def test_sigterm_before_the_loop_saves_the_first_step(tmp_path: Path) -> None:
    code, steps = run_loop(tmp_path, sigterm_at=-1)
    assert code == 143
    assert steps == [0]
    assert published(tmp_path) == {0: 0}


def test_a_restart_resumes_after_the_restored_step(tmp_path: Path) -> None:
    restored_step = 7
    run_loop(tmp_path, sigterm_at=restored_step)
    work = tmp_path / "work"
    (work / "restore.json").write_text(json.dumps(
        {"outcome": "restored", "fresh_start": False, "step": restored_step,
         "path": str(work / f"step-{restored_step}")}))
    code, steps = run_loop(tmp_path, sigterm_at=None)
    assert code == 0
    assert steps == list(range(restored_step + 1, 50))
