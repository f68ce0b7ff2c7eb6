"""The transfer benchmark's rounds: which are warm and which cold, and what
each kind's runs add up to (benchmarks/transfer.py measures them).

A warm round runs every tool on a machine that has run them all before; a
cold round drops the page cache before each run (machine_state), as a node
that just booted would start a restore. Cold rounds are spread among the
warm ones, not run after them, so that drift in the machine hits both kinds
alike. The first round is always warm: it meets a server that has just
started, a cost that belongs to neither kind. Each kind is summed up on its
own: per tool the median and range, per round each tool's ratio to s5cmd
in that same round.
"""

from __future__ import annotations

import statistics
from typing import Any

#: The tool every ratio is taken against.
BASELINE = "s5cmd"
WARM, COLD = "warm", "cold"


def round_kinds(warm: int, cold: int) -> list[str]:
    """The kind of each round, in order: `warm` warm rounds with the `cold`
    ones spread evenly among them, after the first warm one."""
    if warm < 0 or cold < 0:
        raise ValueError(f"rounds: expected counts >= 0, got {warm} warm and {cold} cold")
    kinds = [WARM] * warm
    # Cold round j goes after the warm round (j + 1) * warm / (cold + 1)
    # (at least the first); inserted from the last so positions hold.
    for j in reversed(range(cold)):
        kinds.insert(max(1, (j + 1) * warm // (cold + 1)) if warm else 0, COLD)
    return kinds


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def per_tool(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tool and direction: MB/s and CPU per GB, median and range over the
    runs not starved (all runs where every one was)."""
    out: dict[str, Any] = {}
    for run in runs:
        out.setdefault(f"{run['tool']}.{run['direction']}", []).append(run)
    summary = {}
    for key, group in out.items():
        fed = [r for r in group if not r["starved"]] or group
        summary[key] = {
            "bytes_per_second": spread([r["bytes_per_second"] for r in fed]),
            "cpu_core_seconds_per_gb": spread([r["cpu_core_seconds_per_gb"] for r in fed]),
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in fed),
            "runs": len(group), "starved_runs": sum(r["starved"] for r in group)}
    return summary


def ratios(runs: list[dict[str, Any]], tools: list[str]) -> dict[str, Any]:
    """Per direction and tool: its throughput and CPU per GB over s5cmd's in
    the same round, over the rounds where neither was starved."""
    by = {(r["tool"], r["direction"], r["round"]): r for r in runs}
    out: dict[str, Any] = {}
    for direction in ("upload", "download"):
        for tool in tools:
            if tool == BASELINE:
                continue
            pairs = [(by[(tool, direction, n)], by[(BASELINE, direction, n)])
                     for (t, d, n) in by if t == tool and d == direction
                     and (BASELINE, direction, n) in by]
            fair = [(a, b) for a, b in pairs if not a["starved"] and not b["starved"]]
            entry: dict[str, Any] = {"rounds": len(fair), "starved_rounds": len(pairs) - len(fair)}
            if fair:
                entry["throughput"] = spread([a["bytes_per_second"] / b["bytes_per_second"]
                                              for a, b in fair])
                entry["cpu_per_gb"] = spread([a["cpu_core_seconds_per_gb"]
                                              / b["cpu_core_seconds_per_gb"] for a, b in fair])
            out[f"{tool}.{direction}"] = entry
    return out


def by_kind(runs: list[dict[str, Any]], tools: list[str]) -> dict[str, Any]:
    """Warm and cold runs summed up apart: {kind: {"tools", "ratios"}}, a
    kind without runs left out. A ratio pairs runs of one round, so never a
    warm run with a cold one."""
    out: dict[str, Any] = {}
    for kind in (WARM, COLD):
        mine = [r for r in runs if r["kind"] == kind]
        if mine:
            out[kind] = {"tools": per_tool(mine), "ratios": ratios(mine, tools)}
    return out


def beyond_startup(section: dict[str, Any], runs: list[dict[str, Any]],
                   fixed: dict[str, Any], size: int) -> None:
    """Add to each download ratio of `section` ({"tools", "ratios"}, over
    `runs`) its CPU per GB once each tool's own fixed cost (fixed_cost's CPU)
    is taken off both sides: what each further GB costs, whatever the
    checkpoint's size."""
    by = {(r["tool"], r["round"]): r for r in runs
          if r["direction"] == "download" and not r["starved"]}
    if BASELINE not in fixed:
        return
    for key, entry in section["ratios"].items():
        tool, direction = key.rsplit(".", 1)
        if direction != "download" or tool not in fixed:
            continue
        found = []
        for (t, n), run in by.items():
            base = by.get((BASELINE, n))
            if t != tool or base is None:
                continue
            ours = run["cpu_core_seconds_per_gb"] * size / 1e9 - fixed[tool]["cpu_s"]
            theirs = base["cpu_core_seconds_per_gb"] * size / 1e9 - fixed[BASELINE]["cpu_s"]
            if theirs > 0:  # a start-up measured above a whole run would mean nothing
                found.append(ours / theirs)
        if found:
            entry["cpu_per_gb_beyond_startup"] = spread(found)
