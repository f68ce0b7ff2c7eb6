"""ckptdrain push/pull against s5cmd, boto3, awscrt's native S3 client (the
engine of boto3's CRT mode and Mountpoint) and rclone on one loopback S3
server.

    .venv/bin/python -m benchmarks transfer [--server minio|seaweedfs] [--quick] [--gib N]
        [--dest DIR-ON-A-DISK] [--compare-tree OLD-CHECKOUT] [--tools boto3,awscrt]
        [--rounds N] [--cold-rounds N] [--fixed-rounds N] [--fixed-only]

Same server, same files (one 1 GiB file + 16 × 64 MiB shards = 2 GiB of
random bytes), one run: upload and download throughput, the client's CPU
(core-seconds per GB, from wait4's rusage of the child) and peak RSS; then
rate-limit accuracy at three targets, measured on the wire by a counting
TCP proxy in front of the server (mean over 30 s after a 2 s settle, worst
1 s window), for `ckptdrain push --rate` and `rclone copy --bwlimit`; and
each tool's fixed cost, the download of a one-byte checkpoint, in
`--fixed-rounds` interleaved rounds (transfer_fixed.py; alone with
--fixed-only, against ckptdrain-before too with --compare-tree).
Throughput runs `--rounds` warm and `--cold-rounds` cold rounds of every
tool, interleaved (a cold round drops the page cache before each run, as a
node that just booted restores: transfer_rounds.py); reported per kind are
each tool's median and range, and per round each tool's ratio to s5cmd
(throughput and CPU per GB), median and range. The report states the
machine it ran on, at the start and before each round (machine_state.py). A run during which other
processes took more than 0.3 of a core (or the hypervisor stole 0.1) is
marked starved: it is listed, and its round is left out of the ratios.
Results are printed and written as JSON (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import (
    MiB,
    make_dataset,
    run_child_under_load_watch,
)
from benchmarks.machine_state import CacheDrop, drop_page_cache, read_state
from benchmarks.transfer_fixed import fixed_cost
from benchmarks.transfer_rate import rate_accuracy
from benchmarks.transfer_report import print_report
from benchmarks.transfer_rounds import BASELINE, COLD, beyond_startup, by_kind, round_kinds

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support.s3servers import start_minio, start_seaweedfs  # noqa: E402

BIN = Path(sys.executable).parent
PEERS = Path(__file__).resolve().parent / "transfer_peers"
#: The one measured (BASELINE: the tool every ratio is taken against).
OURS = "ckptdrain"


def _env(server: Any, endpoint: str) -> dict[str, str]:
    env = dict(os.environ)
    # Bytecode as the image has it (compiled when it is built): a shell
    # that sets PYTHONDONTWRITEBYTECODE would otherwise make every Python
    # tool compile our sources again on each run (0.05 s of a 2 s restore).
    # Beside the sources (git ignores __pycache__), not under a prefix: a
    # prefix would also hide site-packages' own bytecode.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(AWS_ACCESS_KEY_ID=server.access_key, AWS_SECRET_ACCESS_KEY=server.secret_key,
               AWS_DEFAULT_REGION=server.region, AWS_REGION=server.region, EP=endpoint,
               CKPTDRAIN_S3_ENDPOINT=endpoint)
    prefix = "RCLONE_CONFIG_BENCH_"
    env.update({prefix + "TYPE": "s3", prefix + "PROVIDER": "Minio" if server.name == "minio"
                else "SeaweedFS", prefix + "ENDPOINT": endpoint,
                prefix + "ACCESS_KEY_ID": server.access_key,
                prefix + "SECRET_ACCESS_KEY": server.secret_key, prefix + "REGION": server.region})
    return env


#: The name of ckptdrain run from another source tree (--compare-tree).
BEFORE = "ckptdrain-before"


def _ours(bucket: str, data: Path, work: Path, tree: Path | None = None) -> tuple[Any, Any]:
    """ckptdrain's push and pull; from `tree`'s sources (another version,
    through PYTHONPATH) when given."""
    run = [str(BIN / "ckptdrain")]
    if tree is not None:
        run = ["env", f"PYTHONPATH={tree / 'operator'}", *run]
    return (
        lambda p: [*run, "push", str(data), f"s3://{bucket}/{p}",
                   "--step", "1", "-q", "--journal", str(work / f"{p}.journal")],
        lambda p, d: [*run, "pull", f"s3://{bucket}/{p}", str(d), "-q"])


def _tools(server: Any, bucket: str, data: Path, work: Path,
           compare_tree: Path | None = None) -> dict[str, Any]:
    """name -> (upload argv for a prefix, download argv for a prefix and a dir)."""
    ep = ["--endpoint-url", server.endpoint_url]
    boto, crt = str(PEERS / "boto3_copy.py"), str(PEERS / "awscrt_copy.py")
    before = {BEFORE: _ours(bucket, data, work, compare_tree)} if compare_tree else {}
    return {
        OURS: _ours(bucket, data, work),
        **before,
        BASELINE: (
            lambda p: [str(BIN / "s5cmd"), *ep, "cp", f"{data}/", f"s3://{bucket}/{p}/"],
            lambda p, d: [str(BIN / "s5cmd"), *ep, "cp", f"s3://{bucket}/{p}/*", f"{d}/"]),
        "boto3": (
            lambda p: [sys.executable, boto, "up", str(data), bucket, f"{p}/"],
            lambda p, d: [sys.executable, boto, "down", bucket, f"{p}/", str(d)]),
        "awscrt": (
            lambda p: [sys.executable, crt, "up", str(data), bucket, f"{p}/"],
            lambda p, d: [sys.executable, crt, "down", bucket, f"{p}/", str(d)]),
    }


def filesystem_of(path: Path) -> str | None:
    from ckptdrain.transfer import direct_io
    return direct_io.filesystem_of(Path(os.path.realpath(path)),
                                   direct_io.MOUNTINFO.read_text())


def _empty_trash(server: Any) -> None:
    """MinIO moves deleted objects to .minio.sys/tmp/.trash and frees them
    later, in the background. On tmpfs that later came too late: 19 GiB of
    trash filled the memory by the third round, every tool slowed down 2–3×
    at 3–4× the CPU per GB, and once MinIO itself was killed by the kernel.
    The benchmark owns the server's data directory, so it empties the trash
    after each tool."""
    trash = server.workdir / "data" / ".minio.sys" / "tmp" / ".trash"
    if trash.is_dir():
        for entry in trash.iterdir():
            shutil.rmtree(entry, ignore_errors=True)


def _compile(env: dict[str, str], compare_tree: Path | None) -> None:
    """Bytecode for every Python tool's sources, as an image has it."""
    trees = [ROOT / "operator", PEERS] + ([compare_tree / "operator"] if compare_tree else [])
    subprocess.run([sys.executable, "-m", "compileall", "-q", *map(str, trees)],
                   env=env, check=True, stdout=subprocess.DEVNULL)


def _fixed(server: Any, bucket: str, work: Path, rounds: int, only: list[str] | None,
           compare_tree: Path | None) -> dict[str, Any]:
    """transfer_fixed.fixed_cost of every tool asked for (ours, s5cmd and
    ckptdrain-before always) on a one-byte checkpoint."""
    tiny = work / "tiny" / "step-1"
    tiny.mkdir(parents=True, exist_ok=True)
    (tiny / "one").write_bytes(b"x")
    env = _env(server, server.endpoint_url)
    _compile(env, compare_tree)
    tools = {k: v for k, v in _tools(server, bucket, tiny, work, compare_tree).items()
             if only is None or k in only or k in (OURS, BASELINE, BEFORE)}
    print(f"fixed cost (a one-byte checkpoint down, {rounds} interleaved rounds):", flush=True)
    return fixed_cost(server, bucket, tools, env, work, rounds)


def throughput(server: Any, bucket: str, data: Path, size: int, work: Path,
               rounds: int, only: list[str] | None = None,
               compare_tree: Path | None = None, dest: Path | None = None,
               cold_rounds: int = 0) -> dict[str, Any]:
    """Every tool up and down, `rounds` warm and `cold_rounds` cold rounds,
    interleaved (transfer_rounds.round_kinds; drift hits all alike). Per run:
    MB/s, core-s/GB, peak RSS and what else ran meanwhile; per round: its
    kind, the machine's state before its first run and, when cold, whether
    the page cache could be dropped; per kind: each tool's medians with their
    range over the runs no other process starved, and per round each tool's
    ratio to s5cmd, where neither run of the pair was starved. Downloads land
    under `dest` (default `work`); the writeback a tool leaves is finished
    (sync, untimed) before the next runs, so no run pays for the one before."""
    dest = work if dest is None else dest
    env = _env(server, server.endpoint_url)
    _compile(env, compare_tree)
    tools = {k: v for k, v in _tools(server, bucket, data, work, compare_tree).items()
             if only is None or k in only or k in (OURS, BASELINE, BEFORE)}
    runs: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    rounds_out: list[dict[str, Any]] = []
    for round_, kind in enumerate(round_kinds(rounds, cold_rounds)):
        drops: list[CacheDrop] = []
        for name, (up, down) in tools.items():
            prefix = f"{name}-{round_}"
            legs = (("upload", up(prefix)), ("download", down(prefix, dest / name)))
            for direction, argv in legs:
                # Before every run, not once a round: the first tool would
                # warm the interpreter and libraries the next ones share.
                if kind == COLD:
                    drops.append(drop_page_cache())
                if len(rounds_out) == round_:
                    rounds_out.append(_round_start(round_, kind, drops))
                run, load = run_child_under_load_watch(argv, env, [server.process.pid])
                if run.returncode != 0 and name in (OURS, BEFORE):
                    raise SystemExit(f"{name} {direction} failed ({run.returncode}): {run.stderr}")
                if run.returncode != 0:  # a peer's failure is a result, reported
                    print(f"  r{round_} {name:9} {direction:8} FAILED: "
                          f"{run.stderr.strip().splitlines()[-1:]}", flush=True)
                    failed.append({"tool": name, "direction": direction, "round": round_,
                                   "kind": kind, "error": run.stderr[-500:]})
                    continue
                record = {"tool": name, "direction": direction, "round": round_, "kind": kind,
                          "seconds": run.seconds, "bytes_per_second": size / run.seconds,
                          "cpu_core_seconds_per_gb": run.cpu_seconds / (size / 1e9),
                          "peak_rss_bytes": run.peak_rss_bytes,
                          "other_cores": load.other_cores, "steal_cores": load.steal_cores,
                          "starved": load.starved}
                if kind == COLD:
                    record["cache_dropped"] = drops[-1].dropped
                runs.append(record)
                os.sync()
                print(f"  r{round_} {name:9} {direction:8} {record['bytes_per_second'] / 1e6:6.0f} "
                      f"MB/s {record['cpu_core_seconds_per_gb']:5.2f} core-s/GB "
                      f"{run.peak_rss_bytes / MiB:5.0f} MiB RSS, others "
                      f"{load.other_cores:.2f} cores{'  STARVED' if load.starved else ''}",
                      flush=True)
            shutil.rmtree(dest / name, ignore_errors=True)
            server.delete_prefix(bucket, prefix + "/")  # keeps a tmpfs workdir small
            _empty_trash(server)
        if kind == COLD:
            # One drop refused is enough to say the round was not quite cold.
            worst = next((d for d in drops if not d.dropped), CacheDrop(True))
            rounds_out[-1].update(cache_dropped=worst.dropped, cache=worst.describe(),
                                  drops=len(drops), drops_refused=sum(not d.dropped for d in drops))
    return {"runs": runs, "failed": failed, "rounds": rounds_out,
            **by_kind(runs, list(tools))}


def _round_start(round_: int, kind: str, drops: list[CacheDrop]) -> dict[str, Any]:
    """A round's record as its first run finds the machine, printed."""
    state = read_state()
    note = f", {drops[-1].describe()}" if drops else ""
    print(f"  r{round_} {kind}{note}: {state.describe()}", flush=True)
    return {"round": round_, "kind": kind, "state_before": state.to_json()}


def recorded_command(argv: list[str]) -> str:
    """The command line that repeats a run given `argv` (this benchmark's own
    arguments, as `python -m benchmarks transfer` hands them on), quoted for
    a shell."""
    return shlex.join(["python", "-m", "benchmarks", "transfer", *argv])


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The options, and in `command` the line that repeats this run. From
    `argv` and not sys.argv: run as `python -m benchmarks transfer`, sys.argv
    still holds the benchmark's name, and the record read `transfer transfer`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks transfer")
    parser.add_argument("--server", choices=("minio", "seaweedfs"), default="minio")
    parser.add_argument("--quick", action="store_true", help="256 MiB of data, 10 s rate runs")
    parser.add_argument("--gib", type=int, default=2,
                        help="GiB of data (half in one file, half in 16 shards; default 2): a "
                             "larger checkpoint weighs each tool's start-up less")
    parser.add_argument("--rates", default="10,25,50", help="targets in MiB/s")
    parser.add_argument("--skip-rate", action="store_true")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved warm rounds")
    parser.add_argument("--cold-rounds", type=int, default=1,
                        help="interleaved cold rounds besides (default 1): the page cache "
                             "dropped before each run, where the kernel lets us")
    parser.add_argument("--fixed-rounds", type=int, default=5,
                        help="interleaved rounds of the fixed cost (a one-byte download)")
    parser.add_argument("--fixed-only", action="store_true",
                        help="only the fixed cost: no dataset, throughput or rate runs")
    parser.add_argument("--compare-tree", type=Path, default=None,
                        help="also run ckptdrain from this source tree (e.g. a git worktree "
                             "of an earlier commit), interleaved, as ckptdrain-before")
    parser.add_argument("--tools", default=None,
                        help="peers besides ckptdrain and s5cmd (comma-separated; default all: "
                             "boto3,awscrt)")
    # tmpfs: the VM disk's writeback made downloads vary 2x from run to run.
    shm = Path("/dev/shm")
    parser.add_argument("--workdir", default=str(shm) if shm.is_dir() else "/var/tmp")
    parser.add_argument("--dest", type=Path, default=None,
                        help="where downloads land (default: the workdir); a directory on a "
                             "disk measures restores onto a disk, where ckptdrain writes by "
                             "direct I/O")
    parser.add_argument("--out", default=None, help="the JSON report (default: docs/"
                        "benchmarks-transfer.json, with --fixed-only benchmarks-fixed-cost.json)")
    args = parser.parse_args(argv)
    args.command = recorded_command(argv)
    if args.out is None:
        args.out = str(ROOT / "docs" / ("benchmarks-fixed-cost.json" if args.fixed_only
                                        else "benchmarks-transfer.json"))
    if args.compare_tree is not None and not (
            args.compare_tree / "operator" / "ckptdrain" / "__init__.py").is_file():
        # PYTHONPATH skips a missing entry: the run would compare us with ourselves.
        parser.error(f"--compare-tree: expected a source tree with operator/ckptdrain/, "
                     f"got {args.compare_tree}")
    if not args.fixed_only and args.gib < 1:
        parser.error(f"--gib: expected a whole number of GiB >= 1, got {args.gib}")
    if args.rounds < 1 or args.cold_rounds < 0:
        parser.error(f"--rounds, --cold-rounds: expected at least 1 warm round and 0 or more "
                     f"cold ones, got {args.rounds} and {args.cold_rounds}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started = time.monotonic()
    machine = read_state()
    print(f"machine: {machine.cpus} CPUs, Linux {machine.kernel}, {machine.describe()}",
          flush=True)
    if args.fixed_only:
        return _fixed_only(args, started, machine.to_json())
    with tempfile.TemporaryDirectory(prefix="ckptdrain-bench-", dir=args.workdir) as tmp:
        work = Path(tmp)
        data = work / "data" / "step-1"
        big, shard = ((128 * MiB, 8 * MiB) if args.quick
                      else (args.gib * 512 * MiB, args.gib * 32 * MiB))
        size = make_dataset(data, big=big, shard=shard)
        print(f"dataset: {size / MiB:.0f} MiB in {data}", flush=True)
        start = start_minio if args.server == "minio" else start_seaweedfs
        with start(work / "server") as server:
            bucket = server.create_bucket()
            report: dict[str, Any] = {"server": server.name, "bytes": size,
                                      "cpus": os.cpu_count(), "command": args.command,
                                      "machine_at_start": machine.to_json()}
            print(f"throughput on {server.name} ({server.endpoint_url}):", flush=True)
            only = args.tools.split(",") if args.tools else None
            dest = work if args.dest is None else Path(
                tempfile.mkdtemp(prefix="ckptdrain-bench-dest-", dir=args.dest))
            report["dest"] = {"path": str(args.dest or args.workdir),
                              "filesystem": filesystem_of(dest)}
            try:
                report["throughput"] = throughput(server, bucket, data, size, work, args.rounds,
                                                  only, args.compare_tree, dest,
                                                  args.cold_rounds)
            finally:
                if dest != work:
                    shutil.rmtree(dest, ignore_errors=True)
            report["fixed_cost"] = _fixed(server, bucket, work, args.fixed_rounds, only,
                                          args.compare_tree)
            # The fixed cost is measured warm: taken off warm runs only.
            warm = report["throughput"]["warm"]
            beyond_startup(warm, [r for r in report["throughput"]["runs"]
                                  if r["kind"] == "warm"], report["fixed_cost"], size)
            if not args.skip_rate:
                print("rate-limit accuracy (on the wire, through a counting proxy):", flush=True)
                targets = [int(x) for x in args.rates.split(",")]
                report["rate"] = rate_accuracy(server, bucket, data, work, targets,
                                               10.0 if args.quick else 30.0,
                                               lambda endpoint: _env(server, endpoint))
    print_report(report["throughput"])
    report["seconds"] = time.monotonic() - started
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} ({report['seconds']:.0f} s in all)")
    return 0


def _fixed_only(args: argparse.Namespace, started: float, machine: dict[str, Any]) -> int:
    with tempfile.TemporaryDirectory(prefix="ckptdrain-bench-", dir=args.workdir) as tmp:
        work = Path(tmp)
        start = start_minio if args.server == "minio" else start_seaweedfs
        with start(work / "server") as server:
            only = args.tools.split(",") if args.tools else None
            report: dict[str, Any] = {
                "server": server.name, "cpus": os.cpu_count(),
                "command": args.command, "machine_at_start": machine,
                "fixed_cost": _fixed(server, server.create_bucket(), work, args.fixed_rounds,
                                     only, args.compare_tree)}
    report["seconds"] = time.monotonic() - started
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} ({report['seconds']:.0f} s in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
