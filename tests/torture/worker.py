"""A long-lived process that runs `ckptdrain.cli.main(argv)` on request.

Categories that make hundreds of CLI calls (hostile manifests, bad input) use
it instead of a new interpreter per call: the same `main()` a user runs, its
stdout/stderr captured, an escaping exception turned into the traceback a real
process would print. Each call runs with the environment it is given. The
process has a memory cap, so a manifest that makes the CLI allocate without
bound kills the worker (reported as a crash), never the machine; a call that
hangs is killed at its timeout and the worker restarted.

Protocol: one JSON line in ({"argv": [...], "env": {...}}), one JSON line out
({"rc": int, "out": str, "err": str}).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import resource
import selectors
import subprocess
import sys
import time
import traceback
from typing import Any

from tests.torture.core import ROOT, Run

MEMORY_CAP = 3 << 30


class _CurrentStderr(io.TextIOBase):
    """Log records go to whatever sys.stderr is during the call."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)


def _serve() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    handler = logging.StreamHandler(_CurrentStderr())
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger("botocore").setLevel(logging.WARNING)
    from ckptdrain import cli

    reply = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stray writes must not break the protocol
    for line in sys.stdin:
        request = json.loads(line)
        os.environ.clear()
        os.environ.update(request["env"])
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(request["argv"])
            except SystemExit as exit_:
                rc = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            except BaseException:  # what a real process would print before dying
                traceback.print_exc()
                rc = 1
        reply.write(json.dumps({"rc": rc, "out": out.getvalue(), "err": err.getvalue()}) + "\n")
        reply.flush()


class Worker:
    """Client side: `call(argv, env)` -> Run; restarts the process after a crash or hang."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.crashes = 0

    def _start(self) -> subprocess.Popen[str]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.torture.worker"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return self.proc

    def call(self, argv: list[str], env: dict[str, str], timeout: float = 60.0) -> Run:
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        started = time.monotonic()
        proc.stdin.write(json.dumps({"argv": argv, "env": env}) + "\n")
        proc.stdin.flush()
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            ready = sel.select(timeout)
        line = proc.stdout.readline() if ready else ""
        seconds = time.monotonic() - started
        if not line:
            self.stop()
            self.crashes += 1
            what = "hung" if not ready else "died (memory cap or crash)"
            return Run(argv, None, "", f"the CLI {what} after {seconds:.0f} s", seconds)
        doc: dict[str, Any] = json.loads(line)
        return Run(argv, int(doc["rc"]), doc["out"], doc["err"], seconds)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


if __name__ == "__main__":
    _serve()
