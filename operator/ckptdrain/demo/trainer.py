"""A small trainer that speaks the ckptdrain protocol, for the demo and the tests.

    python -m ckptdrain.demo.trainer [--mode auto|torch|sim] [--size 256MiB] ...

`torch` trains a stack of linear layers with Adam on the CPU and saves model +
optimizer through `ckptdrain.torch_helper`; `sim` writes `--shards` files of
`--size` bytes in all per checkpoint (the same bytes every step, except a
header naming the step, so writing costs what a real save costs without
spending CPU on random data). Both resume from what restore placed, checkpoint
when the agent asks, and write an emergency checkpoint on SIGTERM. As a
reader (`CKPTDRAIN_ROLE=reader`) it loads what restore placed and never saves.

Several pods can emulate the writers of one synchronous job (the end-to-end
scenario runs two in an indexed Job): `--clock EPOCH` puts them on a shared
step clock (step k is due at EPOCH + k × step-time; a restored trainer runs
its missed steps without pausing) and `--every N` makes them checkpoint the
same steps (multiples of N; a pending request is answered by the next one),
so every writer publishes each step and it completes globally.

Several processes of one pod (`python -m ckptdrain.demo.processes`, as
torchrun `--nproc_per_node`) are one writer: each writes its own shards
(`p<rank>-shard-<i>.bin`, `p<rank>-state.json`) into the pod's step, with a
save id made of the launcher's run id and the step, and each loads and
digests only its own files. On SIGTERM they save the step the launcher
names on their stdin, so the pod's emergency step holds every process.

Prints one JSON object per line on stdout: start, saved, progress, exit
(with several processes, each carries its `process`). With
`--digest`, `saved` carries a SHA-256 over the published step's files and
`start` one over the restored files, so equal digests prove a restore placed
exactly what was saved.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ckptdrain.client import Client

HEADER = 64


#: This process's rank in its pod and their number (demo/processes.py sets them).
LOCAL_RANK = int(os.environ.get("CKPTDRAIN_LOCAL_RANK", "0") or 0)
PROCESSES = int(os.environ.get("CKPTDRAIN_LOCAL_PROCESSES", "1") or 1)


def emit(event: str, **fields: Any) -> None:
    mine = {"process": LOCAL_RANK} if PROCESSES > 1 else {}
    line = json.dumps({"event": event, "t": time.time(), **mine, **fields}) + "\n"
    # One write per line: the pod's processes share one stdout, and print()'s
    # separate write of the newline lets another process's line in between.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), line.encode())


def own_prefix() -> str:
    """What names this process's files in a step it shares with the pod's others."""
    return f"p{LOCAL_RANK}-" if PROCESSES > 1 else ""


def save_id(step: int) -> str | None:
    """One id for the pod's processes saving `step` in this run (None: one process)."""
    if PROCESSES == 1:
        return None
    from ckptdrain.demo.processes import RUN_ENV
    return f"{os.environ.get(RUN_ENV, 'run')}-{step}"


class SimModel:
    """Shards of fixed bytes with a per-step header: cheap to produce, checkable on load."""

    def __init__(self, total: int, shards: int) -> None:
        self.digests: bool = False
        self.saved_digest: str | None = None
        self.shard_size = max(HEADER, total // shards)
        self.shards = shards
        block = os.urandom(1 << 20)
        self.body = bytearray((block * (self.shard_size // len(block) + 1))[: self.shard_size])

    def save(self, client: Client, step: int) -> Path:
        prefix, save = own_prefix(), save_id(step)
        directory = client.begin(step) if save is None else client.begin(step, save=save)
        view = memoryview(self.body)
        for i in range(self.shards):
            self.body[:HEADER] = f"step={step} shard={i}".encode().ljust(HEADER)
            fd = os.open(directory / f"{prefix}shard-{i:03d}.bin", os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                done = 0
                while done < len(view):
                    done += os.write(fd, view[done: done + (8 << 20)])
            finally:
                os.close(fd)
        (directory / f"{prefix}state.json").write_text(
            json.dumps({"step": step, "shards": self.shards}))
        self.saved_digest = tree_digest(directory) if self.digests else None
        return client.complete(step) if save is None else client.complete(step, save=save)

    def load(self, client: Client) -> int | None:
        restored = client.restored()
        if restored is None:
            return None
        prefix = own_prefix()
        state = json.loads((restored.path / f"{prefix}state.json").read_text())
        for i in range(state["shards"]):
            with open(restored.path / f"{prefix}shard-{i:03d}.bin", "rb") as f:
                head = f.read(HEADER).decode().strip()
            if head != f"step={state['step']} shard={i}":
                raise SystemExit(f"restored shard {i} says {head!r}, expected step {state['step']}")
        return int(state["step"])

    def train_step(self, seconds: float) -> None:
        time.sleep(seconds)


class TorchModel:
    def __init__(self, total: int, width: int = 1024) -> None:
        import torch

        from ckptdrain import torch_helper

        self.torch, self.helper = torch, torch_helper
        # Leave the other core(s) to the agent: on a real node it has its own CPUs.
        torch.set_num_threads(1)
        torch.manual_seed(0)
        # fp32 weights + Adam's two moments: 12 bytes per parameter.
        layers = max(1, round(total / 12 / (width * width)))
        self.model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.batch = torch.randn(16, width)
        self.digests: bool = False
        self.saved_digest: str | None = None

    def save(self, client: Client, step: int) -> Path:
        path = self.helper.save(client, step, self.model, self.optimizer)
        self.saved_digest = tree_digest(path) if self.digests else None
        return path

    def load(self, client: Client) -> int | None:
        return self.helper.load(client, self.model, self.optimizer)

    def train_step(self, seconds: float) -> None:
        started = time.monotonic()
        loss = self.model(self.batch).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))


def tree_digest(directory: Path) -> str:
    """SHA-256 over every file below `directory` (this process's, when the pod
    has several): relative names and bytes, in name order."""
    digest = hashlib.sha256()
    prefix = own_prefix()
    for path in sorted(p for p in directory.rglob("*")
                       if p.is_file() and p.name.startswith(prefix)):
        digest.update(f"{path.relative_to(directory)}\0".encode())
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def restored_fields(client: Client, with_digest: bool) -> dict[str, Any]:
    """What restore placed, as the start event reports it (empty on a fresh start)."""
    restored = client.restored()
    if restored is None:
        return {}
    try:
        result = json.loads(client.restore_result.read_text())
    except (OSError, ValueError):
        result = {}
    fields: dict[str, Any] = {
        "tier": restored.tier, "bytes": restored.bytes, "restore_seconds": restored.seconds,
        "source": result.get("source"), "skipped": result.get("skipped", [])}
    if with_digest:
        fields["digest"] = tree_digest(restored.path)
    return fields


def emergency_target() -> int:
    """The step to save on SIGTERM: with several processes, the one the
    launcher named on stdin (every process saves the same step); else, or
    when it named none, the step finished now (-1: at once)."""
    if PROCESSES == 1:
        return -1
    line = sys.stdin.readline().strip()
    return int(line) if line.lstrip("-").isdigit() else -1


def pick_model(mode: str, total: int, shards: int) -> SimModel | TorchModel:
    if mode in ("auto", "torch"):
        try:
            return TorchModel(total)
        except ImportError:
            if mode == "torch":
                raise
    return SimModel(total, shards)


def main(argv: list[str] | None = None) -> int:
    from ckptdrain import units

    parser = argparse.ArgumentParser(prog="ckptdrain-demo-trainer", description=__doc__)
    parser.add_argument("--mode", choices=("auto", "torch", "sim"), default="auto")
    parser.add_argument("--size", default="256MiB", help="bytes per checkpoint")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--step-time", type=float, default=0.2, help="seconds per training step")
    parser.add_argument("--max-steps", type=int, default=10**9)
    parser.add_argument("--no-emergency", action="store_true",
                        help="do not write an emergency checkpoint on SIGTERM")
    parser.add_argument("--preempted-exit", type=int, default=0, metavar="CODE",
                        help="exit code after SIGTERM (a Job reruns an index that exits "
                        "non-zero, e.g. 143; 0 completes it)")
    parser.add_argument("--clock", type=float, metavar="EPOCH",
                        help="shared step clock: step k is due at EPOCH + k × step-time")
    parser.add_argument("--every", type=int, default=0, metavar="N",
                        help="checkpoint every step that is a multiple of N (and answer "
                        "the agent's requests with the next one) instead of at once")
    parser.add_argument("--digest", action="store_true",
                        help="report a SHA-256 of the files of every saved and restored step")
    args = parser.parse_args(argv)
    if args.every < 0:
        parser.error(f"--every: expected a whole number of steps >= 0, got {args.every}")
    client = Client()
    # A reader restores a writer's shard and never writes (docs/pod-contract.md):
    # nothing would capture or drain its saves; they would only fill its work dir.
    writes = client.role != "reader"
    model = pick_model(args.mode, units.parse_bytes("--size", args.size), args.shards)
    model.digests = args.digest
    restored = model.load(client)
    step = 0 if restored is None else restored + 1
    emit("start", from_step=step, restored=restored, mode=type(model).__name__,
         role=client.role, **restored_fields(client, args.digest))
    state = {"step": step}

    def save(finished: int, **fields: Any) -> None:
        started = time.monotonic()
        model.save(client, finished)
        seconds = time.monotonic() - started
        if args.digest:  # taken before complete: with several processes the
            # pod's step is published by whichever completes last
            fields["digest"] = model.saved_digest
        emit("saved", step=finished, seconds=seconds, **fields)

    def emergency() -> None:
        last = state["step"] - 1  # the newest finished step
        emit("sigterm", step=last)
        if writes and last >= 0 and not client.step_dir(last).exists():
            save(last, emergency=True)
        emit("exit", step=last, reason="sigterm")

    def pace() -> float:
        """Seconds the next step takes: on the shared clock, until it is due."""
        if args.clock is None:
            return args.step_time
        return max(0.0, args.clock + (state["step"] + 1) * args.step_time - time.time())

    # SIGTERM only raises a flag; the emergency checkpoint is written at the
    # next step boundary, so it never holds a step half applied (a handler
    # saving mid-step would save step N's weights under N-1's number).
    # Without one, the handler exits at once: nothing is saved, nothing torn.
    client.on_preemption(None, exit_code=args.preempted_exit if args.no_emergency else None)
    target: int | None = None  # the pod's emergency step, once SIGTERM came
    while state["step"] < args.max_steps:
        model.train_step(pace())
        state["step"] += 1
        finished = state["step"] - 1
        client.step_done(finished)
        if finished % 10 == 0:
            emit("progress", step=finished)
        if client.preempting and target is None:
            target = emergency_target()
        if client.preempting and finished >= target:  # type: ignore[operator]
            # First: this boundary's save is the emergency one.
            emergency()
            return args.preempted_exit
        if not writes:  # a reader: no agent asks it for anything
            continue
        request = client.checkpoint_requested()
        if args.every and finished % args.every == 0:
            save(finished, reason="schedule" if request is None else request.reason)
        elif request is not None and not args.every:
            save(finished, reason=request.reason)
    emit("exit", step=state["step"] - 1, reason="max-steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
