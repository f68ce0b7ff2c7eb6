"""The demo trainer as the short e2e scenario runs it: lockstepped writers that
checkpoint the same steps, exit 143 after an emergency checkpoint, and report
digests that tie a restored step to the one saved; as a reader, it never saves."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ckptdrain.demo.trainer import tree_digest

EVERY = 5


def start(work: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "CKPTDRAIN_WORK_DIR": str(work)}
    return subprocess.Popen(
        [sys.executable, "-m", "ckptdrain.demo.trainer", "--mode", "sim", "--size", "64KiB",
         "--shards", "2", "--step-time", "0.02", "--digest", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def events(proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    out, err = proc.communicate(timeout=30)
    assert not err.strip() or "Traceback" not in err, err
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def run_until(work: Path, step: int, *args: str) -> tuple[int, list[dict[str, Any]]]:
    """Run until `step` is published, then SIGTERM; exit code and events."""
    proc = start(work, *args)
    deadline = time.monotonic() + 30
    while not (work / f"step-{step}").is_dir():
        assert proc.poll() is None and time.monotonic() < deadline, "trainer stopped early"
        time.sleep(0.01)
    time.sleep(0.05)  # a few steps past it, so the emergency step is a new one
    proc.send_signal(signal.SIGTERM)
    found = events(proc)
    return proc.returncode, found


def test_lockstepped_writers_save_the_same_steps_and_exit_143(tmp_path: Path) -> None:
    clock = f"{time.time():.3f}"
    saved = {}
    for writer in ("a", "b"):
        # A SIGTERM that lands just after a scheduled save has nothing newer to
        # save (about one time in EVERY): run again, in a fresh work dir.
        for attempt in range(5):
            work = tmp_path / writer / str(attempt)
            code, found = run_until(work, 3 * EVERY, "--clock", clock,
                                    "--every", str(EVERY), "--preempted-exit", "143")
            if any(e.get("emergency") for e in found):
                break
        assert code == 143
        scheduled = [e["step"] for e in found if e["event"] == "saved" and not e.get("emergency")]
        assert scheduled and all(s % EVERY == 0 for s in scheduled)
        emergency = [e for e in found if e.get("emergency")]
        # The newest finished step, saved once: a SIGTERM between a step's end
        # and its scheduled save makes that multiple of EVERY the emergency one.
        assert len(emergency) == 1 and emergency[0]["step"] > max(scheduled)
        for e in found:
            if e["event"] == "saved":
                assert e["digest"] == tree_digest(work / f"step-{e['step']}")
        saved[writer] = set(scheduled)
    assert {0, EVERY, 2 * EVERY, 3 * EVERY} <= saved["a"] & saved["b"]


def test_a_restored_step_reports_the_digest_it_was_saved_with(tmp_path: Path) -> None:
    code, found = run_until(tmp_path, 2 * EVERY, "--every", str(EVERY))
    assert code == 0  # the demo's default: a preempted demo run ends cleanly
    digest = next(e["digest"] for e in found if e["event"] == "saved" and e["step"] == EVERY)
    (tmp_path / "restore.json").write_text(json.dumps({
        "fresh_start": False, "step": EVERY, "tier": "global", "bytes": 65536,
        "seconds": 0.5, "path": str(tmp_path / f"step-{EVERY}"), "skipped": [],
        "source": "s3://bucket/run/5"}))
    for newer in tmp_path.glob("step-*"):  # as restore leaves the work dir at pod start
        if int(newer.name.split("-")[1]) > EVERY:
            shutil.rmtree(newer)
    code, found = run_until(tmp_path, 3 * EVERY, "--every", str(EVERY))
    first = found[0]
    assert first["event"] == "start" and first["restored"] == EVERY
    assert first["from_step"] == EVERY + 1 and first["tier"] == "global"
    assert first["digest"] == digest

    # A restored step whose bytes changed no longer matches its save.
    shard = tmp_path / f"step-{EVERY}" / "shard-001.bin"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert tree_digest(tmp_path / f"step-{EVERY}") != digest


def test_a_negative_interval_is_refused_in_one_line(tmp_path: Path) -> None:
    proc = start(tmp_path, "--every", "-1")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "--every" in err and "Traceback" not in err


def test_a_sigterm_mid_step_is_saved_at_the_step_boundary(tmp_path: Path) -> None:
    """The emergency checkpoint is written once the running step has finished,
    under that step's number: never the weights of a half-done step saved
    under the previous number, as a save inside the signal handler would."""
    env = {**os.environ, "CKPTDRAIN_WORK_DIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptdrain.demo.trainer", "--mode", "sim", "--size", "64KiB",
         "--shards", "2", "--step-time", "1.0", "--every", "1000", "--preempted-exit", "143"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = iter(proc.stdout)  # one reader: a second one would miss what this one buffered
    first = json.loads(next(line for line in lines if '"progress"' in line))
    assert first["step"] == 0  # step 0 done; step 1 runs for the next second
    time.sleep(0.3)
    signalled = time.time()
    proc.send_signal(signal.SIGTERM)
    found = [json.loads(line) for line in lines if line.startswith("{")]
    assert proc.wait(timeout=30) == 143
    sigterm = next(e for e in found if e["event"] == "sigterm")
    assert sigterm["step"] == 1 and sigterm["t"] >= signalled + 0.5, sigterm
    assert [e["step"] for e in found if e["event"] == "saved" and e.get("emergency")] == [1]
    assert (tmp_path / "step-1").is_dir() and not (tmp_path / "step-2").exists()



def test_a_reader_loads_the_restored_step_and_never_saves(tmp_path: Path) -> None:
    """A reader (CKPTDRAIN_ROLE=reader) resumes from what restore placed and
    writes nothing: no scheduled step, no emergency step on SIGTERM."""
    _, found = run_until(tmp_path, EVERY, "--every", str(EVERY))
    digest = next(e["digest"] for e in found if e["event"] == "saved" and e["step"] == EVERY)
    (tmp_path / "restore.json").write_text(json.dumps({
        "fresh_start": False, "step": EVERY, "tier": "global", "bytes": 65536,
        "seconds": 0.5, "path": str(tmp_path / f"step-{EVERY}"), "skipped": [],
        "source": "s3://bucket/run/5"}))
    for other in tmp_path.glob("step-*"):  # restore leaves only the step it placed
        if other.name != f"step-{EVERY}":
            shutil.rmtree(other)
    env = {**os.environ, "CKPTDRAIN_WORK_DIR": str(tmp_path), "CKPTDRAIN_ROLE": "reader"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptdrain.demo.trainer", "--mode", "sim", "--size", "64KiB",
         "--shards", "2", "--step-time", "0.02", "--digest", "--every", str(EVERY),
         "--preempted-exit", "143"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    read: list[dict[str, Any]] = []
    for line in proc.stdout:  # past three more multiples of EVERY, then SIGTERM
        read.append(json.loads(line))
        if read[-1]["event"] == "progress" and read[-1]["step"] >= 5 * EVERY:
            break
    proc.send_signal(signal.SIGTERM)
    read += [json.loads(line) for line in proc.stdout if line.startswith("{")]
    assert proc.wait(timeout=30) == 143
    start = read[0]
    assert start["event"] == "start" and start["role"] == "reader"
    assert start["restored"] == EVERY and start["digest"] == digest
    assert [e["event"] for e in read if e["event"] not in ("start", "progress")] == \
        ["sigterm", "exit"], read
    assert sorted(p.name for p in tmp_path.glob("step-*")) == [f"step-{EVERY}"]
