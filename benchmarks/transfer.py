"""ckptdrain push/pull against s5cmd, boto3 and rclone on one loopback S3 server.

    .venv/bin/python -m benchmarks transfer [--server minio|seaweedfs] [--quick]

Same server, same files (one 1 GiB file + 16 × 64 MiB shards = 2 GiB of
random bytes), one run: upload and download throughput, the client's CPU
(core-seconds per GB, from wait4's rusage of the child) and peak RSS; then
rate-limit accuracy at three targets, measured on the wire by a counting
TCP proxy in front of the server (mean over 30 s after a 2 s settle, worst
1 s window), for `ckptdrain push --rate` and `rclone copy --bwlimit`.
Throughput runs `--rounds` times per tool, interleaved; the fastest run of
each is kept. Results are printed and written as JSON (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import CountingProxy, MiB, make_dataset, rate_stats, run_child

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support.s3servers import start_minio, start_seaweedfs  # noqa: E402

BIN = Path(sys.executable).parent
BOTO_UP = """
import os, sys, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["EP"])
src, bucket, prefix = sys.argv[1:4]
for d, _, files in os.walk(src):
    for f in files:
        p = os.path.join(d, f)
        s3.upload_file(p, bucket, prefix + os.path.relpath(p, src))
"""
BOTO_DOWN = """
import os, sys, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["EP"])
bucket, prefix, dest = sys.argv[1:4]
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
    for o in page.get("Contents", []):
        p = os.path.join(dest, o["Key"][len(prefix):])
        os.makedirs(os.path.dirname(p), exist_ok=True)
        s3.download_file(bucket, o["Key"], p)
"""


def _env(server: Any, endpoint: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(AWS_ACCESS_KEY_ID=server.access_key, AWS_SECRET_ACCESS_KEY=server.secret_key,
               AWS_DEFAULT_REGION=server.region, AWS_REGION=server.region, EP=endpoint,
               CKPTDRAIN_S3_ENDPOINT=endpoint)
    prefix = "RCLONE_CONFIG_BENCH_"
    env.update({prefix + "TYPE": "s3", prefix + "PROVIDER": "Minio" if server.name == "minio"
                else "SeaweedFS", prefix + "ENDPOINT": endpoint,
                prefix + "ACCESS_KEY_ID": server.access_key,
                prefix + "SECRET_ACCESS_KEY": server.secret_key, prefix + "REGION": server.region})
    return env


def throughput(server: Any, bucket: str, data: Path, size: int, work: Path,
               rounds: int) -> dict[str, Any]:
    env = _env(server, server.endpoint_url)
    ep = ["--endpoint-url", server.endpoint_url]
    tools = {
        "ckptdrain": (
            lambda p: [str(BIN / "ckptdrain"), "push", str(data), f"s3://{bucket}/{p}",
                       "--step", "1", "-q", "--journal", str(work / f"{p}.journal")],
            lambda p, d: [str(BIN / "ckptdrain"), "pull", f"s3://{bucket}/{p}", str(d), "-q"]),
        "s5cmd": (
            lambda p: [str(BIN / "s5cmd"), *ep, "cp", f"{data}/", f"s3://{bucket}/{p}/"],
            lambda p, d: [str(BIN / "s5cmd"), *ep, "cp", f"s3://{bucket}/{p}/*", f"{d}/"]),
        "boto3": (
            lambda p: [sys.executable, "-c", BOTO_UP, str(data), bucket, f"{p}/"],
            lambda p, d: [sys.executable, "-c", BOTO_DOWN, bucket, f"{p}/", str(d)]),
    }
    results: dict[str, Any] = {}
    for round_ in range(rounds):  # tools interleaved, so drift hits all alike
        for name, (up, down) in tools.items():
            prefix = f"{name}-{round_}"
            runs = (("upload", up(prefix)), ("download", down(prefix, work / name)))
            for direction, argv in runs:
                run = run_child(argv, env)
                if run.returncode != 0:
                    raise SystemExit(f"{name} {direction} failed ({run.returncode}): {run.stderr}")
                print(f"  {name:9} {direction:8} {size / run.seconds / 1e6:8.0f} MB/s  "
                      f"{run.cpu_seconds / (size / 1e9):5.2f} core-s/GB  "
                      f"{run.peak_rss_bytes / MiB:6.0f} MiB RSS", flush=True)
                best = results.get(f"{name}.{direction}")
                if best is None or run.seconds < best["seconds"]:
                    results[f"{name}.{direction}"] = {
                        "seconds": run.seconds, "bytes_per_second": size / run.seconds,
                        "cpu_core_seconds_per_gb": run.cpu_seconds / (size / 1e9),
                        "peak_rss_bytes": run.peak_rss_bytes,
                    }
            shutil.rmtree(work / name, ignore_errors=True)
            server.delete_prefix(bucket, prefix + "/")  # keeps a tmpfs workdir small
    return results


def rate_accuracy(server: Any, bucket: str, data: Path, work: Path, targets: list[int],
                  span: float) -> dict[str, Any]:
    host, port = server.endpoint_url.split("//")[1].split(":")
    proxy = CountingProxy(host, int(port))
    env = _env(server, f"http://127.0.0.1:{proxy.port}")
    results: dict[str, Any] = {}
    try:
        for mib in targets:
            target = mib * MiB
            tools = {
                "ckptdrain": [str(BIN / "ckptdrain"), "push", str(data),
                              f"s3://{bucket}/rate-ckptdrain-{mib}", "--step", "1", "--rate",
                              f"{mib}MiB/s", "-q", "--journal", str(work / f"rate-{mib}.j")],
                "rclone": [str(BIN / "rclone"), "copy", str(data),
                           f"bench:{bucket}/rate-rclone-{mib}", "--bwlimit", f"{mib}M", "-q"],
            }
            for name, argv in tools.items():
                proxy.reset()
                proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
                deadline = time.monotonic() + span + 15
                while time.monotonic() < deadline and proc.poll() is None:
                    if proxy.events and time.monotonic() > proxy.events[0][0] + 2 + span + 0.5:
                        break
                    time.sleep(0.2)
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                stats = rate_stats(proxy.reset(), target, span=span)
                server.delete_prefix(bucket, f"rate-{name}-{mib}/")
                results[f"{name}.{mib}MiB/s"] = {"target": target, **stats}
                print(f"  {name:9} {mib:3d} MiB/s: mean {stats['mean_error']:+.2%}, "
                      f"worst 1 s window {stats['worst_1s_excess']:+.2%} "
                      f"over {stats.get('seconds', 0):.0f} s", flush=True)
    finally:
        proxy.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks transfer")
    parser.add_argument("--server", choices=("minio", "seaweedfs"), default="minio")
    parser.add_argument("--quick", action="store_true", help="256 MiB of data, 10 s rate runs")
    parser.add_argument("--rates", default="10,25,50", help="targets in MiB/s")
    parser.add_argument("--skip-rate", action="store_true")
    parser.add_argument("--rounds", type=int, default=2, help="runs per tool (fastest kept)")
    # tmpfs: the VM disk's writeback made downloads vary 2x from run to run.
    shm = Path("/dev/shm")
    parser.add_argument("--workdir", default=str(shm) if shm.is_dir() else "/var/tmp")
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks-transfer.json"))
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ckptdrain-bench-", dir=args.workdir) as tmp:
        work = Path(tmp)
        data = work / "data" / "step-1"
        big, shard = (128 * MiB, 8 * MiB) if args.quick else (1024 * MiB, 64 * MiB)
        size = make_dataset(data, big=big, shard=shard)
        print(f"dataset: {size / MiB:.0f} MiB in {data}", flush=True)
        start = start_minio if args.server == "minio" else start_seaweedfs
        with start(work / "server") as server:
            bucket = server.create_bucket()
            report: dict[str, Any] = {"server": server.name, "bytes": size,
                                      "cpus": os.cpu_count(), "command": " ".join(sys.argv)}
            print(f"throughput on {server.name} ({server.endpoint_url}):", flush=True)
            report["throughput"] = throughput(server, bucket, data, size, work, args.rounds)
            if not args.skip_rate:
                print("rate-limit accuracy (on the wire, through a counting proxy):", flush=True)
                targets = [int(x) for x in args.rates.split(",")]
                report["rate"] = rate_accuracy(server, bucket, data, work, targets,
                                               10.0 if args.quick else 30.0)
    t = report["throughput"]
    for d in ("upload", "download"):
        ours = t[f"ckptdrain.{d}"]["bytes_per_second"]
        report[f"{d}_vs_s5cmd"] = ours / t[f"s5cmd.{d}"]["bytes_per_second"]
        report[f"{d}_vs_boto3"] = ours / t[f"boto3.{d}"]["bytes_per_second"]
        print(f"{d}: {report[f'{d}_vs_s5cmd']:.2f}× s5cmd, {report[f'{d}_vs_boto3']:.2f}× boto3")
    report["seconds"] = time.monotonic() - started
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} ({report['seconds']:.0f} s in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
