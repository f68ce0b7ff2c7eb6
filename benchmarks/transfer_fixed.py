"""Each tool's fixed cost: the download of a one-byte checkpoint (start-up,
imports, credentials, client set-up, the listing, the manifest, the end),
in interleaved rounds (benchmarks/transfer.py runs it after the
throughput rounds, or alone with --fixed-only). A restore of N GB takes
about this plus N over the tool's throughput, and pays it on every node
of every restart."""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from typing import Any

from benchmarks.harness import run_child, run_child_under_load_watch


def fixed_cost(server: Any, bucket: str, tools: dict[str, Any], env: dict[str, str],
               work: Path, rounds: int) -> dict[str, Any]:
    """`tools` (name -> (upload argv for a prefix, download argv for a prefix
    and a dir), the upload's source a directory holding one byte) each
    upload it to `bucket`, then
    download it once per round, every tool in turn each round (drift hits
    all alike). Per tool: wall and CPU seconds, median and range over the
    runs no other process starved (all runs where every one was), and how
    many runs were starved."""
    ready = []
    for name, (up, _) in tools.items():
        if run_child(up(f"tiny-{name}"), env).returncode == 0:
            ready.append(name)
    runs: dict[str, list[tuple[Any, Any]]] = {name: [] for name in ready}
    for _ in range(rounds):
        for name in ready:
            run, load = run_child_under_load_watch(
                tools[name][1](f"tiny-{name}", work / "tiny-down"), env, [server.process.pid])
            shutil.rmtree(work / "tiny-down", ignore_errors=True)
            if run.returncode == 0:
                runs[name].append((run, load))
    out: dict[str, Any] = {}
    for name in ready:
        server.delete_prefix(bucket, f"tiny-{name}/")
        got = runs[name]
        if not got:
            continue
        fed = [run for run, load in got if not load.starved] or [run for run, _ in got]
        wall = [run.seconds for run in fed]
        cpu = [run.cpu_seconds for run in fed]
        out[name] = {"wall_s": statistics.median(wall), "wall_min_s": min(wall),
                     "wall_max_s": max(wall), "cpu_s": statistics.median(cpu),
                     "cpu_min_s": min(cpu), "cpu_max_s": max(cpu), "runs": len(got),
                     "starved_runs": sum(load.starved for _, load in got)}
        e = out[name]
        print(f"  {name:16} {e['wall_s'] * 1000:5.0f} ms wall ({e['wall_min_s'] * 1000:.0f}–"
              f"{e['wall_max_s'] * 1000:.0f}) {e['cpu_s'] * 1000:5.0f} ms CPU "
              f"({e['cpu_min_s'] * 1000:.0f}–{e['cpu_max_s'] * 1000:.0f}), "
              f"{e['runs']} runs ({e['starved_runs']} starved)", flush=True)
    return out

