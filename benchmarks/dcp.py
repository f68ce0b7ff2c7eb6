"""Restore throughput of a resharded DCP read against the plain restore of the same bytes.

    .venv/bin/python -m benchmarks dcp [--server minio|seaweedfs] [--size 256MiB]
        [--writers 2] [--readers 1,2,3] [--part-size 16MiB] [--rounds 2]

One loopback S3 server. `--writers` ranks save one step with ckptdrain.dcp
(a gloo group, every matrix sharded over them); each writer's directory is
drained into the store. Then, per round and interleaved:
- plain fetch: `fetch` of every writer's files of the step (the restore
  init container's read, all writers one after the other in one process),
  the whole step's bytes, verified whole-file;
- local dcp.load: one rank loads those fetched files with DCP's own
  FileSystemReader (what a trainer spends after a plain restore; DCP's
  floor under any load);
- resharded, for each reader count M: M ranks load the step from the store
  with a StoreReader (each fetching the parts its shards touch, verified per
  part), timed inside the ranks after a barrier: the slowest rank's load.
Throughput is the step's bytes over that time (for M ranks: the aggregate).
The fastest round of each is kept. Printed, and written as JSON (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support.s3servers import start_minio, start_seaweedfs  # noqa: E402

from ckptdrain import units  # noqa: E402
from ckptdrain.transfer.drain import Drainer  # noqa: E402
from ckptdrain.transfer.fetch import fetch  # noqa: E402
from ckptdrain.transfer.scan import build_manifest  # noqa: E402

STEP = 100
MiB = 1 << 20


def _ranks(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.dcp_rank", json.dumps(j)],
                              env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for j in jobs]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"a rank failed ({proc.returncode}):\n{stderr[-3000:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks dcp", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=("minio", "seaweedfs"), default="minio")
    parser.add_argument("--size", default="256MiB", help="the step's state size")
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--readers", default="1,2,3", help="reader counts, comma-separated")
    parser.add_argument("--part-size", default="16MiB", help="the drain's part size")
    parser.add_argument("--concurrency", type=int, default=8, help="ranged GETs per reader")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-dcp.json")
    args = parser.parse_args(argv)
    size = units.parse_bytes("--size", args.size)
    part = units.parse_bytes("--part-size", args.part_size)
    readers = [int(r) for r in args.readers.split(",")]
    start = start_minio if args.server == "minio" else start_seaweedfs
    work = Path(tempfile.mkdtemp(prefix="ckptdrain-bench-dcp-"))
    try:
        with start(work / "server") as server:
            bucket = server.create_bucket()
            store = server.open_store(bucket, "job")
            cfg = {"endpoint": server.endpoint_url, "region": server.region,
                   "access": server.access_key, "secret": server.secret_key,
                   "bucket": bucket, "prefix": "job"}
            dirs = [work / f"writer-{w}" for w in range(args.writers)]
            _ranks([{"mode": "save", "rank": w, "world": args.writers, "size": size,
                     "init": str(work / "init-save"), "work_dir": str(dirs[w]), "step": STEP}
                    for w in range(args.writers)])
            step_bytes = 0
            for w, d in enumerate(dirs):
                manifest = build_manifest(d / f"step-{STEP}", STEP, w, args.writers,
                                          created=time.time())
                step_bytes += manifest.total_bytes
                Drainer(store, part_size=part).drain(
                    d / f"step-{STEP}", manifest, journal_path=work / f"journal-{w}",
                    cancel=threading.Event())
            best: dict[str, float] = {}
            detail: dict[str, Any] = {}
            for round_ in range(args.rounds):
                dest = work / f"plain-{round_}"
                started = time.perf_counter()
                for w in range(args.writers):
                    fetch(store, dest / str(w), step=STEP, writer=w)
                plain = time.perf_counter() - started
                best["plain fetch"] = min(best.get("plain fetch", plain), plain)
                merged = work / f"merged-{round_}"
                merged.mkdir()
                for w in range(args.writers):
                    for f in (dest / str(w)).iterdir():
                        f.rename(merged / f.name)
                shutil.rmtree(dest)
                local = _ranks([{"mode": "local", "rank": 0, "world": 1, "size": size,
                                 "dir": str(merged)}])[0]
                shutil.rmtree(merged)
                if not local["equal"]:
                    raise RuntimeError("the local load differs from the saved state")
                best["local dcp.load"] = min(best.get("local dcp.load", local["seconds"]),
                                             local["seconds"])
                for m in readers:
                    results = _ranks([{"mode": "load", "rank": r, "world": m, "size": size,
                                       "init": str(work / f"init-load-{round_}-{m}"),
                                       "store": cfg, "step": STEP,
                                       "concurrency": args.concurrency} for r in range(m)])
                    if not all(r["equal"] for r in results):
                        raise RuntimeError(f"{m} readers loaded a state unequal to the saved one")
                    seconds = max(r["seconds"] for r in results)
                    key = f"resharded-{m}"
                    if seconds < best.get(key, float("inf")):
                        best[key] = seconds
                        detail[key] = {"fetched_bytes": sum(r["fetched"] for r in results),
                                       "rank_seconds": [round(r["seconds"], 3) for r in results]}
            fetched = {"plain fetch": step_bytes, "local dcp.load": 0}
            rows = {k: {"seconds": round(s, 3), "MiB_per_s": round(step_bytes / MiB / s, 1),
                        **detail.get(k, {"fetched_bytes": fetched.get(k, 0)})}
                    for k, s in best.items()}
            report = {"server": args.server, "step_bytes": step_bytes, "writers": args.writers,
                      "part_size": part, "concurrency": args.concurrency,
                      "rounds": args.rounds, "results": rows}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"step: {step_bytes / MiB:.0f} MiB from {args.writers} writers, "
          f"parts of {part / MiB:.0f} MiB, {args.server}")
    for name, row in rows.items():
        print(f"  {name:15} {row['seconds']:7.3f} s  {row['MiB_per_s']:7.1f} MiB/s  "
              f"fetched {row['fetched_bytes'] / MiB:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
