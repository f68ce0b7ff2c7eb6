"""Capture throughput vs `cp -r` + `sync`, and SIGTERM-to-durable time, on one disk.

    .venv/bin/python -m benchmarks.capture [--dir /var/tmp] [--size 2GiB] [--files 16]
                                            [--rounds 3] [--sigterm-size 2GiB]

1. Capture vs cp: the same source (hot in the page cache for both, so both
   measure the write path) is copied `--rounds` times by `cp -r SRC DST &&
   sync -f DST` and by `LocalTier.capture` (copy + CRC32C + fsync of files and
   directories + manifest + rename), alternating; medians are compared. The
   capture is held to copying (reflink and link refused, as for a work dir on
   another mount): on one filesystem it would link (benchmarks/save_capture.py).
   Target: capture >= 0.9x cp + sync.
2. SIGTERM to durable: a real agent (local tier only) and a published 2 GiB
   step it has not captured yet; SIGTERM; time until the step is durable on the
   local tier (its `Local` event) and until the agent exited. Includes the
   agent's 1 s wait for a trainer's emergency checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.save_capture import ANOTHER_MOUNT
from ckptdrain import units
from ckptdrain.node.localtier import LocalTier


def make_source(root: Path, total: int, files: int) -> Path:
    """`files` files of random-looking bytes (a 4 MiB random block, repeated)."""
    root.mkdir(parents=True)
    block = os.urandom(4 << 20)
    each = total // files
    for i in range(files):
        with open(root / f"shard-{i:03d}.bin", "wb") as f:
            left = each
            while left > 0:
                n = min(left, len(block))
                f.write(block[:n])
                left -= n
    subprocess.run(["sync", "-f", str(root)], check=True)
    return root


def warm(path: Path) -> None:
    """Read everything once so both contenders start from the page cache."""
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(16 << 20):
                    pass


def time_cp(src: Path, dst: Path) -> float:
    started = time.monotonic()
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    subprocess.run(["sync", "-f", str(dst)], check=True)
    return time.monotonic() - started


def time_capture(src: Path, local: Path, step: int) -> float:
    started = time.monotonic()
    LocalTier(local, methods=ANOTHER_MOUNT).capture(src, step, writer=0, writers=1)
    return time.monotonic() - started


def bench_capture(base: Path, total: int, files: int, rounds: int) -> dict[str, float]:
    src = make_source(base / "src", total, files)
    cp_times, cap_times = [], []
    for r in range(rounds):
        warm(src)
        cp_times.append(time_cp(src, base / f"cp-{r}"))
        shutil.rmtree(base / f"cp-{r}")
        subprocess.run(["sync", "-f", str(base)], check=True)
        warm(src)
        cap_times.append(time_capture(src, base / "local", r))
        shutil.rmtree(base / "local")
        subprocess.run(["sync", "-f", str(base)], check=True)
    cp_s, cap_s = statistics.median(cp_times), statistics.median(cap_times)
    shutil.rmtree(src)
    return {"bytes": total, "cp_sync_s": cp_s, "capture_s": cap_s,
            "cp_sync_Bps": total / cp_s, "capture_Bps": total / cap_s,
            "ratio": cp_s / cap_s, "cp_all": cp_times, "capture_all": cap_times}  # type: ignore[dict-item]


def bench_sigterm(base: Path, total: int) -> dict[str, float]:
    work, local = base / "work", base / "local"
    events = base / "events.jsonl"
    make_source(work / "step-1.tmp", total, 8)
    env = dict(os.environ, CKPTDRAIN_WORK_DIR=str(work), CKPTDRAIN_LOCAL_DIR=str(local),
               CKPTDRAIN_INTERVAL="1h", CKPTDRAIN_GRACE_SECONDS="120", CKPTDRAIN_METRICS_PORT="0")
    env.pop("CKPTDRAIN_STORE_URI", None)
    with open(base / "agent.log", "wb") as log:
        agent = subprocess.Popen([sys.executable, "-m", "ckptdrain.agent.command",
                                  "--events", str(events)], env=env, stdout=log, stderr=log)
    time.sleep(3)  # let it start (imports) and settle into its loop
    warm(work / "step-1.tmp")
    os.rename(work / "step-1.tmp", work / "step-1")  # published "just now"...
    sent = time.time()
    agent.send_signal(signal.SIGTERM)  # ...and the pod is evicted at once
    agent.wait(300)
    exited = time.time()
    local_at = next(json.loads(line)["at"] for line in events.read_text().splitlines()
                    if json.loads(line)["state"] == "Local")
    LocalTier(local).verify(1)
    return {"bytes": total, "sigterm_to_durable_s": local_at - sent,
            "sigterm_to_exit_s": exited - sent, "exit_code": agent.returncode}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    parser.add_argument("--size", default="2GiB")
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sigterm-size", default="2GiB")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="ckptdrain-bench-", dir=args.dir) as tmp:
        size = units.parse_bytes("--size", args.size)
        results["capture"] = bench_capture(Path(tmp) / "cap", size, args.files, args.rounds)
        results["sigterm"] = bench_sigterm(Path(tmp) / "sig",
                                           units.parse_bytes("--sigterm-size", args.sigterm_size))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    cap = results["capture"]
    sig = results["sigterm"]
    assert isinstance(cap, dict) and isinstance(sig, dict)
    print(f"capture vs cp+sync ({units.format_bytes(cap['bytes'])}, {args.files} files, "
          f"median of {args.rounds}):")
    print(f"  cp -r + sync -f   {units.format_rate(cap['cp_sync_Bps'])}  ({cap['cp_sync_s']:.2f}s)")
    print(f"  capture           {units.format_rate(cap['capture_Bps'])}  ({cap['capture_s']:.2f}s)")
    print(f"  ratio             {cap['ratio']:.2f}x  (target >= 0.9x)")
    print(f"SIGTERM to durable ({units.format_bytes(sig['bytes'])}): "
          f"{sig['sigterm_to_durable_s']:.2f}s; agent exited after "
          f"{sig['sigterm_to_exit_s']:.2f}s with {sig['exit_code']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
