"""What every torture category shares: options, the tally, trees, and running the CLI.

The CLI is always the real `ckptdrain` code: a subprocess where kills and
outputs matter (`spawn`, `run_cli`), or the long-lived `worker` process when a
category makes hundreds of calls (same `main()`, no interpreter start-up each).
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CATEGORIES = ("kills", "outages", "corruption", "hostile", "badinput", "canary", "diskfull",
              "writers", "agreement", "leaks")
ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


@dataclass
class Options:
    stores: list[str]
    kills: int = 10
    manifests: int = 20
    outages: int = 1
    rounds: int = 2  # corruption rounds per kind, concurrent-writer rounds
    agreements: int = 200  # randomized restore-agreement trials (real apiserver)
    size: int = 4 * MiB
    seed: int = 0
    only: tuple[str, ...] = CATEGORIES
    scratch: Path = Path("/tmp")
    rng: random.Random = field(default_factory=random.Random)


@dataclass
class Run:
    """One finished command: exit code (None: it never ended), outputs, seconds."""

    argv: list[str]
    rc: int | None
    out: str
    err: str
    seconds: float = 0.0

    def brief(self) -> str:
        tail = " | ".join(self.err.strip().splitlines()[-3:])[:400]
        command = " ".join(self.argv)
        command = command if len(command) < 160 else command[:157] + "..."
        return f"exit {self.rc}: {tail or '(no stderr)'} [ckptdrain {command}]"


@dataclass
class Category:
    """Tried/failed counts and the failures' details for one category on one store."""

    name: str
    store: str
    tried: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""
    seconds: float = 0.0

    def check(self, ok: bool, detail: str) -> bool:
        """Count one trial; on failure keep `detail` (what was seen, enough to reproduce)."""
        self.tried += 1
        if not ok:
            self.failed += 1
            if len(self.failures) < 200:
                self.failures.append(detail)
        return ok

    def fail(self, detail: str) -> None:
        self.check(False, detail)

    def add(self, figure: str, amount: int = 1) -> None:
        self.figures[figure] = self.figures.get(figure, 0) + amount


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without any store settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "CKPTDRAIN_", "GOOGLE_", "STORAGE_EMULATOR_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def ckptdrain_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "ckptdrain", *args]


def run_cli(args: list[str], env: dict[str, str], timeout: float = 300.0,
            module: str = "ckptdrain") -> Run:
    """The real CLI as a subprocess, to completion (or killed at `timeout`: rc None)."""
    started = time.monotonic()
    argv = [sys.executable, "-m", module, *args]
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                              errors="replace", cwd=ROOT)
        rc: int | None = proc.returncode
        out, err = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exp:
        rc = None
        out = _text(exp.stdout)
        err = _text(exp.stderr) + f"\n(killed after {timeout:.0f} s)"
    return Run(args, rc, out, err, time.monotonic() - started)


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class Spawned:
    """A CLI subprocess with its output in files, to be killed at a random moment."""

    def __init__(self, args: list[str], env: dict[str, str], logdir: Path,
                 module: str = "ckptdrain") -> None:
        logdir.mkdir(parents=True, exist_ok=True)
        stamp = f"{time.monotonic_ns()}"
        self.args = args
        self.out_path, self.err_path = logdir / f"{stamp}.out", logdir / f"{stamp}.err"
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", module, *args], env=env,
                                         stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         cwd=ROOT)
        self.started = time.monotonic()

    def kill(self) -> bool:
        """SIGKILL it; True if it was still running (the kill landed)."""
        if self.proc.poll() is not None:
            return False
        self.proc.kill()
        self.proc.wait(30)
        return True

    def wait(self, timeout: float = 300.0) -> Run:
        try:
            rc: int | None = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            rc = None
        return Run(self.args, rc, self.out_path.read_text(errors="replace"),
                   self.err_path.read_text(errors="replace"), time.monotonic() - self.started)


TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s+File \".*\", line \d+", re.M)


def output_problems(run: Run, codes: set[int] | None = None) -> list[str]:
    """Why `run` breaks the CLI's error contract (no traceback; one error line; a
    documented exit code), or nothing."""
    found = []
    if run.rc is None:
        found.append("did not finish (hung)")
    if TRACEBACK.search(run.err) or TRACEBACK.search(run.out):
        found.append("printed a traceback")
    if codes is not None and run.rc not in codes:
        found.append(f"exit {run.rc}, expected {sorted(codes)}")
    if run.rc not in (0, None):
        lines = [ln for ln in run.err.splitlines() if ln.strip()
                 and not ln.startswith(("usage:", " ", "\t"))
                 and "WARNING" not in ln and "INFO" not in ln and "skipped" not in ln]
        # `verify` lists its findings on stdout; anything else says one line on stderr.
        if len(lines) > 1 or (not lines and not run.out.strip()):
            found.append(f"{len(lines)} error lines on stderr, expected 1")
    return found


# -- trees ------------------------------------------------------------------------


def make_tree(root: Path, rng: random.Random, total: int, files: int = 5) -> dict[str, bytes]:
    """Write `files` files (nested, one empty) of `total` bytes in all; return their digests."""
    root.mkdir(parents=True, exist_ok=True)
    cuts = sorted(rng.randrange(total + 1) for _ in range(files - 2))
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)] + [0]
    block = rng.randbytes(1 << 20)
    for i, size in enumerate(sizes):
        rel = f"shard-{i}.bin" if i % 2 == 0 else f"opt/rank{i}/state-{i}.pt"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as out:
            out.write(rng.randbytes(min(size, 64)))  # distinct head: no two trees alike
            left = size - min(size, 64)
            while left > 0:
                out.write(block[: min(left, len(block))])
                left -= min(left, len(block))
    return tree_digest(root)


def tree_digest(root: Path) -> dict[str, bytes]:
    """{relative path: sha256} of every regular file under `root` (hidden ones too)."""
    found = {}
    if not root.is_dir():
        return found
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).digest()
    return found


def visible(root: Path) -> list[str]:
    """Names in `root` a trainer would see (not hidden); [] when it is missing."""
    try:
        return sorted(n for n in os.listdir(root) if not n.startswith("."))
    except FileNotFoundError:
        return []


def snapshot(root: Path, skip: tuple[Path, ...] = ()) -> set[str]:
    """Every path under `root` (files and dirs), minus the subtrees in `skip`."""
    found = set()
    for dirpath, dirs, names in os.walk(root):
        here = Path(dirpath)
        dirs[:] = [d for d in dirs if here / d not in skip]
        for name in [*dirs, *names]:
            found.add(str((here / name).relative_to(root)))
    return found
