"""Run several processes of one pod, as torchrun `--nproc_per_node` does, for
the simulated trainer (no torch needed):

    python -m ckptdrain.demo.processes --processes 2 --clock EPOCH --step-time 0.2 \\
        -- python3 -m ckptdrain.demo.trainer --mode sim ...

Every process gets CKPTDRAIN_LOCAL_RANK and CKPTDRAIN_LOCAL_PROCESSES (the
pod's processes are one writer, docs/trainer-protocol.md) and one run id,
new at every start of this launcher, from which the trainers make their save
ids: a save left half-done by a run that crashed is never completed by the
next one.

SIGTERM reaches this launcher (the container's PID 1). The processes of a
synchronous job save an emergency checkpoint of one step together, so the
launcher picks it: on the shared step clock, the step after the one running
now (no process has finished it yet, and none lags by more than it). It
writes that step to every process's stdin, then forwards SIGTERM. Like
torchrun, when one process fails the others are stopped and the launcher
exits with the failure's code.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import time
from types import FrameType

#: The environment a launched trainer reads its run id from.
RUN_ENV = "CKPTDRAIN_DEMO_RUN"


def emergency_step(clock: float | None, step_time: float, now: float) -> int:
    """The step every process saves on SIGTERM: the one after the step due
    now on the shared clock; -1 (each saves its newest finished step) without
    a clock."""
    if clock is None or step_time <= 0:
        return -1
    return max(0, math.floor((now - clock) / step_time) + 1)


def launch(command: list[str], processes: int, clock: float | None,
           step_time: float) -> int:
    run = f"{time.time_ns():x}"
    children = []
    for rank in range(processes):
        env = {**os.environ, "CKPTDRAIN_LOCAL_RANK": str(rank),
               "CKPTDRAIN_LOCAL_PROCESSES": str(processes), RUN_ENV: run}
        children.append(subprocess.Popen(command, env=env, stdin=subprocess.PIPE))
    stopping = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        step = emergency_step(clock, step_time, time.time())
        for child in children:
            try:
                assert child.stdin is not None
                child.stdin.write(f"{step}\n".encode())
                child.stdin.flush()
                child.send_signal(signal.SIGTERM)
            except (OSError, ValueError):  # it exited already
                pass

    signal.signal(signal.SIGTERM, forward)
    while True:
        codes = [child.poll() for child in children]
        failed = [c for c in codes if c not in (None, 0)]
        if failed and not stopping:
            for child in children:
                if child.poll() is None:
                    child.terminate()
            for child in children:
                child.wait()
            return failed[0]
        if all(c is not None for c in codes):
            return next((c for c in codes if c), 0)  # type: ignore[return-value]
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: python -m ckptdrain.demo.processes --processes N "
                         "[--clock EPOCH --step-time S] -- COMMAND...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="ckptdrain-demo-processes", description=__doc__)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--clock", type=float)
    parser.add_argument("--step-time", type=float, default=0.2)
    args = parser.parse_args(argv[:split])
    if args.processes < 1:
        parser.error(f"--processes: expected a whole number >= 1, got {args.processes}")
    command = argv[split + 1:]
    if not command:
        parser.error("expected the trainer's command after --")
    return launch(command, args.processes, args.clock, args.step_time)


if __name__ == "__main__":
    sys.exit(main())
