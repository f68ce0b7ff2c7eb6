"""What the scenario says as it runs: timestamped lines, checks that stop the
run with `Failed`, and the rows of the report table it ends with.

`say` and `check` are handed to every step module (peer.py, chaos.py, ...),
so one clock (T0, the driver's start) times every line of the run."""

from __future__ import annotations

import time
from pathlib import Path

from kube import Failed

T0 = time.monotonic()
REPORT: list[str] = []


def say(text: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {text}", flush=True)


def check(ok: object, what: str) -> None:
    if not ok:
        raise Failed(what)
    say(f"  ok: {what}")


def write_report(path: Path) -> None:
    """The report table, total time last, to `path` and stdout."""
    total = time.monotonic() - T0
    REPORT.append(f"| scenario steps 1–8 | {total:.0f} s |")
    table = "| what | measured |\n| --- | --- |\n" + "\n".join(REPORT) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(table)
    print("\n" + table, flush=True)
