"""Agent peak RSS while draining a large checkpoint (default 8 GiB).

    .venv/bin/python -m benchmarks.agent_rss [--size 8GiB] [--dir /var/tmp]
                                              [--part-size 64MiB] [--concurrency 8]

A local step of `--size` (sparse files, so setting up costs no disk writes) is
placed in a local tier; a real agent process starts with a file:// global
tier on the same disk, finds the step not yet global and drains it at full
speed. Its VmHWM (peak resident set) is read from /proc while it drains.
Target: peak RSS <= concurrency x part size + 100 MiB.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ckptdrain import checksum, units
from ckptdrain.manifest import FileEntry, WriterManifest
from ckptdrain.node.localtier import LocalTier


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in KiB."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0])
    return fields.get("VmRSS", 0), fields.get("VmHWM", 0)


def sparse_step(local: Path, step: int, total: int, files: int) -> WriterManifest:
    data = LocalTier(local).data_dir(step)
    data.mkdir(parents=True)
    entries = []
    for i in range(files):
        path = data / f"shard-{i:03d}.bin"
        with open(path, "wb") as f:
            f.truncate(total // files)
        size, crc = checksum.crc32c_file(path)
        entries.append(FileEntry(path.name, size, checksum.to_hex(crc)))
    manifest = WriterManifest(step=step, writer=0, writers=1, files=tuple(entries),
                              created=time.time())
    (data.parent / "manifest.json").write_bytes(manifest.to_json())
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="8GiB")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    parser.add_argument("--part-size", default="64MiB")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--store", choices=("file", "seaweedfs"), default="file",
                        help="global tier: file:// on the same disk, or a local SeaweedFS")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    total = units.parse_bytes("--size", args.size)
    part = units.parse_bytes("--part-size", args.part_size)
    with tempfile.TemporaryDirectory(prefix="ckptdrain-rss-", dir=args.dir) as tmp, \
            contextlib.ExitStack() as stack:
        root = Path(tmp)
        sparse_step(root / "local", 1, total, args.files)
        store_env = {"CKPTDRAIN_STORE_URI": f"file://{root / 'store'}"}
        if args.store == "seaweedfs":
            from ckptdrain.demo.seaweed import running_seaweedfs

            store_env = stack.enter_context(running_seaweedfs(root / "seaweedfs"))
        env = dict(os.environ, **store_env, CKPTDRAIN_WORK_DIR=str(root / "work"),
                   CKPTDRAIN_LOCAL_DIR=str(root / "local"), CKPTDRAIN_INTERVAL="1h",
                   CKPTDRAIN_DEFAULT_RATE="100GB/s", CKPTDRAIN_METRICS_PORT="0",
                   CKPTDRAIN_PART_SIZE=args.part_size,
                   CKPTDRAIN_CONCURRENCY=str(args.concurrency))
        env.pop("CKPTDRAIN_SHARE_FILE", None)
        with open(root / "agent.log", "wb") as log:
            agent = subprocess.Popen([sys.executable, "-m", "ckptdrain.agent.command"],
                                     env=env, stdout=log, stderr=log)
        started = time.monotonic()
        peak_rss = 0
        tier = LocalTier(root / "local")
        while not tier.is_global(1):
            if agent.poll() is not None:
                raise SystemExit(f"agent exited: {(root / 'agent.log').read_text()[-3000:]}")
            rss, hwm = rss_kib(agent.pid)
            peak_rss = max(peak_rss, rss, hwm)
            time.sleep(0.2)
        seconds = time.monotonic() - started
        _, hwm = rss_kib(agent.pid)
        agent.send_signal(signal.SIGTERM)
        agent.wait(60)
    peak = max(peak_rss, hwm) * 1024
    bound = args.concurrency * part + (100 << 20)
    result = {"store": args.store, "bytes": total, "part_size": part,
              "concurrency": args.concurrency,
              "peak_rss_bytes": peak, "bound_bytes": bound, "within_bound": peak <= bound,
              "drain_seconds_incl_start": seconds}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"agent draining {units.format_bytes(total)} ({args.concurrency} x "
              f"{units.format_bytes(part)} parts): peak RSS {peak / 2**20:.0f} MiB, bound "
              f"{bound / 2**20:.0f} MiB -> {'OK' if peak <= bound else 'OVER'}; "
              f"{seconds:.1f}s incl. start-up ({units.format_rate(total / seconds)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
