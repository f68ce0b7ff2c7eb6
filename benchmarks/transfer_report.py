"""The transfer benchmark's printed report: the machine's state, and warm
and cold rounds side by side (per tool MB/s; per round each tool over
s5cmd), from the JSON report's own figures (transfer_rounds.by_kind)."""

from __future__ import annotations

from typing import Any

from benchmarks.transfer_rounds import COLD, WARM

KEY = 20  # the width of the tool.direction column
CELL = 34  # and of the warm column: "1234 (1200–1300) [12, 12 starved]"


def _range(s: dict[str, float], scale: float = 1.0, fmt: str = ".2f", unit: str = "") -> str:
    return (f"{s['median'] * scale:{fmt}}{unit} ({s['min'] * scale:{fmt}}–"
            f"{s['max'] * scale:{fmt}})")


def _keys(kinds: dict[str, Any], part: str) -> list[str]:
    """tool.direction keys of either kind, warm's order first."""
    keys: list[str] = []
    for kind in (WARM, COLD):
        keys += [k for k in kinds.get(kind, {}).get(part, {}) if k not in keys]
    return keys


def throughput_lines(kinds: dict[str, Any]) -> list[str]:
    """Per tool and direction: MB/s, median (range), warm beside cold."""
    lines = [f"  {'MB/s':{KEY}} {'warm':{CELL}} cold"]
    for key in _keys(kinds, "tools"):
        cells = []
        for kind in (WARM, COLD):
            entry = kinds.get(kind, {}).get("tools", {}).get(key)
            cells.append("—" if entry is None else
                         f"{_range(entry['bytes_per_second'], 1e-6, '.0f')} "
                         f"[{entry['runs']}, {entry['starved_runs']} starved]")
        lines.append(f"  {key:{KEY}} {cells[0]:{CELL}} {cells[1]}")
    return lines


def _ratio_cell(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "—"
    if "throughput" not in entry:
        return f"no fair round ({entry['starved_rounds']} starved)"
    return (f"{_range(entry['throughput'], unit='×')} the throughput, "
            f"{_range(entry['cpu_per_gb'], unit='×')} the CPU per GB, over "
            f"{entry['rounds']} rounds ({entry['starved_rounds']} starved)")


def ratio_lines(kinds: dict[str, Any]) -> list[str]:
    """Per tool and direction: its ratios to s5cmd in the same round, warm
    above cold, and warm's CPU per GB beyond each tool's start-up."""
    lines = []
    for key in _keys(kinds, "ratios"):
        warm = kinds.get(WARM, {}).get("ratios", {}).get(key)
        cold = kinds.get(COLD, {}).get("ratios", {}).get(key)
        lines.append(f"  {key:{KEY}} warm {_ratio_cell(warm)}")
        lines.append(f"  {'':{KEY}} cold {_ratio_cell(cold)}")
        if warm is not None and "cpu_per_gb_beyond_startup" in warm:
            lines.append(f"  {'':{KEY}}      {_range(warm['cpu_per_gb_beyond_startup'], unit='×')}"
                         f" the CPU per GB beyond each tool's start-up")
    return lines


def round_lines(rounds: list[dict[str, Any]]) -> list[str]:
    """Per round: its kind, a cold round's drop result, and the machine's
    state before its first run."""
    lines = []
    for r in rounds:
        state = r["state_before"]
        mem = state["memory"]
        lines.append(f"  r{r['round']} {r['kind']:4} {r.get('cache', ''):28} up "
                     f"{state['uptime_s'] / 3600:.1f} h, load {state['load'][0]:.2f}, GiB free "
                     f"{mem.get('free', 0) / (1 << 30):.1f} available "
                     f"{mem.get('available', 0) / (1 << 30):.1f} cached "
                     f"{mem.get('cached', 0) / (1 << 30):.1f}")
    return lines


def print_report(throughput: dict[str, Any]) -> None:
    kinds = {k: throughput[k] for k in (WARM, COLD) if k in throughput}
    print("rounds (a cold round drops the page cache before each run; the machine "
          "before the round's first run):")
    print("\n".join(round_lines(throughput["rounds"])))
    print("each tool's throughput (median, range over the runs not starved; "
          "[runs, starved]):")
    print("\n".join(throughput_lines(kinds)))
    print("each tool over s5cmd in the same round (median, range; rounds where either "
          "was starved left out and counted):")
    print("\n".join(ratio_lines(kinds)))
