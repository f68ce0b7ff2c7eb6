"""`ckptdrain demo` (`make demo`): the whole life of a checkpoint on one machine.

Real processes, no cluster: restore (fresh start) → agent + trainer on a short
schedule, the drain throttled to the sizing model's bandwidth so it is
visible → SIGTERM to both, as an eviction would → restore on the "same node"
(a new, empty work dir; the local tier survives) → the trainer resumes from
the restored step → a summary of what the sizing model asked for and what
happened.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from ckptdrain import flags, sizing, units
from ckptdrain.demo.summary import DrainStats, Event, describe, newest
from ckptdrain.node.localtier import LocalTier
from ckptdrain.transfer import journal as jr


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", choices=("file", "seaweedfs"), default="file",
                        help="global tier: a file:// directory, or a SeaweedFS the demo starts")
    parser.add_argument("--mode", choices=("auto", "torch", "sim"), default="auto",
                        help="trainer: real PyTorch (CPU) when importable, else simulated")
    parser.add_argument("--size", default=None,
                        help="bytes per checkpoint (default 64MiB with PyTorch, else 256MiB)")
    parser.add_argument("--interval", default="4s", help="local checkpoint interval")
    parser.add_argument("--global-every", type=int, default=2)
    parser.add_argument("--overlap", default="25%", help="target drain time / global interval")
    parser.add_argument("--run", default="24s", help="how long to train before the SIGTERM")
    parser.add_argument("--grace", default="10s", help="termination grace period")
    parser.add_argument("--dir", type=Path, default=None,
                        help="keep everything here instead of a temporary directory")


class Proc:
    """A child process whose stdout lines (JSON or not) land in a queue."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = open(log, "ab")  # noqa: SIM115 - closed in wait()
        self.popen = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                      stderr=self.log, text=True)
        self.lines: queue.Queue[dict[str, object]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        stream: IO[str] | None = self.popen.stdout
        assert stream is not None
        for line in stream:
            with contextlib.suppress(ValueError):
                self.lines.put(json.loads(line))

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        finally:
            self.log.close()


class Demo:
    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args = args
        self.root = root
        self.work, self.local = root / "work", root / "local"
        self.events_path, self.logs = root / "events.jsonl", root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.events: list[Event] = []
        self._events_offset = 0
        self._progress_at = 0.0
        self.trainer_step = -1
        self.trainer_exit_step: int | None = None

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", flush=True)

    def env(self, store_env: dict[str, str], rate: float) -> dict[str, str]:
        share = self.root / "share" / "bandwidth"
        share.parent.mkdir(exist_ok=True)
        share.write_text(str(int(rate)))
        env = dict(os.environ)
        env.update(store_env)
        env.update({
            "CKPTDRAIN_WORK_DIR": str(self.work), "CKPTDRAIN_LOCAL_DIR": str(self.local),
            "CKPTDRAIN_LOCAL_KEEP": "2", "CKPTDRAIN_INTERVAL": self.args.interval,
            "CKPTDRAIN_GLOBAL_EVERY": str(self.args.global_every),
            "CKPTDRAIN_OVERLAP": self.args.overlap, "CKPTDRAIN_SHARE_FILE": str(share),
            "CKPTDRAIN_DEFAULT_RATE": str(int(rate)), "CKPTDRAIN_GRACE_SECONDS": self.args.grace,
            "CKPTDRAIN_METRICS_PORT": "0", "CKPTDRAIN_PART_SIZE": "8MiB",
            "CKPTDRAIN_CONCURRENCY": "4", "PYTHONUNBUFFERED": "1",
        })
        return env

    def poll_drain_progress(self) -> None:
        """Once a second, how far the drain in flight is (read from its journal)."""
        now = time.monotonic()
        if now - self._progress_at < 1.0:
            return
        self._progress_at = now
        done = {e.step for e in self.events if e.state == "Global"}
        draining = [e for e in self.events if e.state == "Draining" and e.step not in done]
        if not draining:
            return
        event = max(draining, key=lambda e: e.step)
        journal = jr.load(LocalTier(self.local).journal_path(event.step))
        if journal is not None and event.bytes:
            sent = journal.done_bytes
            self.say(f"step {event.step}: draining, {units.format_bytes(sent)} of "
                     f"{units.format_bytes(event.bytes)} ({sent / event.bytes:.0%})")

    def poll_events(self) -> None:
        try:
            with open(self.events_path) as f:
                f.seek(self._events_offset)
                for line in f:
                    if not line.endswith("\n"):
                        break
                    self._events_offset += len(line)
                    event = Event.from_dict(json.loads(line))
                    self.events.append(event)
                    if event.state != "Capturing":
                        self.say(describe(event))
        except FileNotFoundError:
            pass

    def poll_trainer(self, trainer: Proc) -> None:
        while True:
            try:
                doc = trainer.lines.get_nowait()
            except queue.Empty:
                return
            step = doc.get("step")
            if isinstance(step, int):
                self.trainer_step = max(self.trainer_step, step)
            if doc.get("event") == "saved":
                kind = "emergency checkpoint" if doc.get("emergency") else "checkpoint"
                self.say(f"trainer: wrote {kind} step {step} in "
                         f"{units.format_duration(float(doc['seconds']))}")  # type: ignore[arg-type]
            elif doc.get("event") == "exit" and isinstance(step, int):
                self.trainer_exit_step = step
            elif doc.get("event") == "start":
                self.say(f"trainer ({doc.get('mode')}): starting at step {doc.get('from_step')}")

    def restore(self, env: dict[str, str]) -> dict[str, object]:
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "ckptdrain.restore.command"], env=env,
                              capture_output=True, text=True, timeout=120)
        seconds = time.monotonic() - started
        for line in proc.stdout.splitlines():
            self.say(line)
        if proc.returncode != 0:
            raise SystemExit(f"restore failed ({proc.returncode}): {proc.stderr[-2000:]}")
        doc: dict[str, object] = json.loads((self.work / "restore.json").read_text())
        doc["wall_seconds"] = seconds
        return doc


def trainer_argv(args: argparse.Namespace, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ckptdrain.demo.trainer", "--mode", args.mode,
            "--size", args.size, "--step-time", "0.2", *extra]


@contextlib.contextmanager
def global_tier(kind: str, root: Path) -> Iterator[dict[str, str]]:
    if kind == "file":
        # As a pod's volume would be: restore takes a missing one for a typo.
        (root / "store").mkdir(parents=True, exist_ok=True)
        yield {"CKPTDRAIN_STORE_URI": f"file://{root / 'store'}"}
        return
    from ckptdrain.demo.seaweed import running_seaweedfs

    with running_seaweedfs(root / "seaweedfs") as env:
        yield env


def resolve_mode(args: argparse.Namespace) -> None:
    """Decide torch vs sim here, so the size (and the sizing model) match the trainer."""
    if args.mode == "auto":
        args.mode = "torch" if importlib.util.find_spec("torch") is not None else "sim"
    if args.size is None:
        # A CPU step of a 64 MiB model takes ~0.3 s here; 256 MiB would make the demo crawl.
        args.size = "64MiB" if args.mode == "torch" else "256MiB"


def sizing_model(args: argparse.Namespace) -> sizing.Sizing:
    """The sizing model of the demo's arguments (each checked, by its flag)."""
    return sizing.compute(sizing.SizingInput(
        checkpoint_bytes=units.parse_bytes("--size", args.size),
        interval_s=flags.duration("--interval", args.interval),
        global_every=args.global_every,
        overlap=units.parse_fraction("--overlap", args.overlap)))


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse a bad argument before anything is created: a refusal leaves no
    directory behind to be told about."""
    for flag in ("run", "grace"):
        flags.duration(f"--{flag}", getattr(args, flag))
    sizing_model(args)


def run(args: argparse.Namespace) -> int:
    resolve_mode(args)
    check_arguments(args)
    root = args.dir or Path(tempfile.mkdtemp(prefix="ckptdrain-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    code = 1
    try:
        with global_tier(args.store, root) as store_env:
            code = _run(args, root, store_env)
            return code
    finally:
        if args.dir is None and code == 0:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"  kept {root} (logs in {root / 'logs'})", flush=True)


def _run(args: argparse.Namespace, root: Path, store_env: dict[str, str]) -> int:
    demo = Demo(args, root)
    size = units.parse_bytes("--size", args.size)
    interval = flags.duration("--interval", args.interval)
    model = sizing_model(args)
    rate = model.required_bandwidth
    env = demo.env(store_env, rate)
    demo.say(f"sizing model: {units.format_bytes(size)} every {units.format_duration(interval)},"
             f" every {args.global_every}. global, overlap {args.overlap} ->"
             f" drain share {units.format_rate(rate)}")
    demo.say(f"work dir {demo.work}, local tier {demo.local}, "
             f"global tier {store_env['CKPTDRAIN_STORE_URI']}")
    demo.restore(env)

    agent = Proc("agent", [sys.executable, "-m", "ckptdrain.agent.command",
                           "--events", str(demo.events_path)], env, demo.logs / "agent.log")
    trainer = Proc("trainer", trainer_argv(args), env, demo.logs / "trainer.log")
    run_for = flags.duration("--run", args.run)
    started = time.monotonic()
    while time.monotonic() - started < run_for:
        demo.poll_trainer(trainer)
        demo.poll_events()
        demo.poll_drain_progress()
        for proc in (agent, trainer):
            if proc.popen.poll() is not None:
                raise SystemExit(f"{proc.name} exited early ({proc.popen.returncode});"
                                 f" see {demo.logs / (proc.name + '.log')}")
        time.sleep(0.1)

    sigterm_wall = time.time()
    at_sigterm = {tier: newest(demo.events, state, sigterm_wall)
                  for tier, state in (("local", "Local"), ("global", "Global"))}
    demo.say(f"SIGTERM to trainer and agent (grace {args.grace})")
    for proc in (trainer, agent):
        proc.popen.send_signal(signal.SIGTERM)
    grace = flags.duration("--grace", args.grace)
    deadline = time.monotonic() + grace + 5
    while time.monotonic() < deadline and agent.popen.poll() is None:
        demo.poll_trainer(trainer)
        demo.poll_events()
        demo.poll_drain_progress()
        time.sleep(0.1)
    codes = {p.name: p.wait(timeout=max(1.0, deadline - time.monotonic()))
             for p in (trainer, agent)}
    demo.poll_trainer(trainer)
    demo.poll_events()
    flushed = time.monotonic()
    demo.say(f"exit codes {codes}; agent flushed in "
             f"{units.format_duration(flushed - started - run_for)}")

    last_before = demo.trainer_exit_step if demo.trainer_exit_step is not None \
        else demo.trainer_step
    demo.say("pod rescheduled on the same node: new (empty) work dir, the local tier survives")
    shutil.rmtree(demo.work)
    restored = demo.restore(env)
    resumed = Proc("trainer", trainer_argv(args, "--max-steps",
                                           str(int(restored.get("step") or -1) + 6)),
                   env, demo.logs / "trainer-resumed.log")
    resumed.wait(timeout=120)
    demo.poll_trainer(resumed)

    stats = DrainStats.of(demo.events, flushed - started)
    # Work lost = the trainer's last finished step before it exited, minus where it resumed.
    lost = last_before - int(restored["step"]) if restored.get("step") is not None else None
    print_summary(demo, model, stats, at_sigterm, sigterm_wall, restored, lost)
    return 0 if all(c == 0 for c in codes.values()) and restored.get("step") is not None else 1


def print_summary(demo: Demo, model: sizing.Sizing, stats: DrainStats,
                  at_sigterm: dict[str, Event | None], sigterm_wall: float,
                  restored: dict[str, object], lost: int | None) -> None:
    def point(tier: str) -> str:
        e = at_sigterm[tier]
        return "none" if e is None else f"step {e.step} (there {sigterm_wall - e.at:.1f}s)"

    final_global = newest(demo.events, "Global")
    rows = [
        ("sizing-model bandwidth", units.format_rate(model.required_bandwidth)),
        ("achieved drain rate", f"{units.format_rate(stats.rate)} over {stats.drains} drains,"
                                " end to end (incl. verification and commit)"),
        ("observed overlap", f"{units.format_percent(stats.overlap)} of wall time draining"
                             f" (target {units.format_percent(model.overlap)})"),
        ("recovery point at SIGTERM", f"local {point('local')}; global {point('global')}"),
        ("after the SIGTERM flush", "global step "
         + (str(final_global.step) if final_global else "none")),
        ("restore", f"step {restored.get('step')} from the {restored.get('tier')} tier,"
                    f" {units.format_bytes(int(restored.get('bytes') or 0))} in"  # type: ignore[call-overload]
                    f" {units.format_duration(float(restored.get('seconds') or 0))}"  # type: ignore[arg-type]
                    f" ({units.format_duration(float(restored['wall_seconds']))}"  # type: ignore[arg-type]
                    " with process start)"),
        ("steps lost", "unknown" if lost is None else
         f"{lost} (trainer's last step {lost + int(restored.get('step') or 0)},"  # type: ignore[call-overload]
         f" restored step {restored.get('step')})"),
    ]
    print("\nsummary")
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ckptdrain demo", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
