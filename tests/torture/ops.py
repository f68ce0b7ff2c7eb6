"""The few ckptdrain operations every category performs, with their outputs checked.

Pushes that a category kills run as real subprocesses (core.Spawned); the
reads around them (ls, verify, pull, restore) go through the worker, which
runs the same CLI `main()` without an interpreter start-up per call.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.torture.core import Options, Run, clean_env, tree_digest
from tests.torture.stores import Area
from tests.torture.worker import Worker


@dataclass
class Ctx:
    """What a category gets: the options, the CLI worker, and a scratch directory."""

    opts: Options
    worker: Worker
    scratch: Path

    def cli(self, area: Area | None, *args: str, timeout: float = 120.0,
            env: dict[str, str] | None = None) -> Run:
        base = clean_env(area.env if area is not None else {})
        return self.worker.call(list(args), {**base, **(env or {})}, timeout=timeout)

    def ls(self, area: Area) -> tuple[Run, dict[int, dict[str, Any]]]:
        """`ls --json` -> {step: row}; {} when the output is not the documented JSON."""
        run = self.cli(area, "ls", area.uri, "--json")
        try:
            rows = {int(r["step"]): r for r in json.loads(run.out)} if run.rc == 0 else {}
        except (ValueError, KeyError, TypeError):
            rows = {}
        return run, rows

    def complete_uri(self, uri: str) -> list[int]:
        """Complete steps of a file:// store that no Area describes."""
        run = self.worker.call(["ls", uri, "--json"], clean_env())
        try:
            return [int(r["step"]) for r in json.loads(run.out) if r.get("complete")]
        except (ValueError, KeyError, TypeError):
            return []

    def complete(self, area: Area) -> list[int]:
        return sorted((s for s, r in self.ls(area)[1].items() if r.get("complete")), reverse=True)

    def pull(self, area: Area, dest: Path, *args: str) -> tuple[Run, dict[str, bytes]]:
        shutil.rmtree(dest, ignore_errors=True)
        run = self.cli(area, "pull", area.uri, str(dest), "--json", *args)
        return run, tree_digest(dest)

    def restore(self, area: Area | None, work: Path, local: Path, *, writer: int = 0,
                writers: int = 1, env: dict[str, str] | None = None,
                timeout: float = 120.0, result: Path | None = None
                ) -> tuple[Run, dict[str, Any]]:
        """`ckptdrain restore` into `work`; the result file's JSON ({} when absent)."""
        result = result or work.parent / f"{work.name}-restore.json"
        result.unlink(missing_ok=True)
        args = ["restore", "--work-dir", str(work), "--local-dir", str(local),
                "--writer-id", str(writer), "--writers", str(writers),
                "--restore-result", str(result), "--metrics-port", "0"]
        if area is not None:
            args += ["--store-uri", area.uri]
        run = self.cli(area, *args, timeout=timeout, env=env)
        try:
            doc = json.loads(result.read_text())
        except (OSError, ValueError):
            doc = {}
        return run, doc


def digest_of_step(doc: dict[str, Any]) -> dict[str, bytes]:
    """The digest of the directory a restore result points to."""
    return tree_digest(Path(doc["path"])) if doc.get("path") else {}


def same(a: dict[str, bytes], b: dict[str, bytes]) -> bool:
    return bool(a) and a == b
