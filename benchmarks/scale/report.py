"""The figures of every size as a markdown table and JSON, with how each grows:
the exponent k in figure ∝ size^k between the smallest and the largest size
(writers at a fixed policy count, and policies at a fixed writer count)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

#: (column, unit, how to read it from one size's result, target or "")
Figure = tuple[str, str, Callable[[dict[str, Any]], float | None], str]


def _get(*path: str) -> Callable[[dict[str, Any]], float | None]:
    def read(result: dict[str, Any]) -> float | None:
        value: Any = result
        for key in path:
            if not isinstance(value, dict) or key not in value:
                return None
            value = value[key]
        return float(value) if isinstance(value, int | float) else None
    return read


def _largest_kib(result: dict[str, Any]) -> float | None:
    sizes = result.get("largest_bytes") or {}
    return round(max(sizes.get("checkpoint", 0), sizes.get("pod", 0)) / 1024, 1)


def _percent(*path: str) -> Callable[[dict[str, Any]], float | None]:
    read = _get(*path)
    return lambda r: None if read(r) is None else round(100 * (read(r) or 0.0), 2)


FIGURES: Sequence[Figure] = (
    ("admission p50", "ms", _get("admission_with_n_present", "p50_ms"), ""),
    ("admission p99", "ms", _get("admission_with_n_present", "p99_ms"), "≤ 50"),
    ("… same pods not opted in, p99", "ms",
     _get("creation_without_webhook_with_n_present", "p99_ms"), ""),
    ("share visible (all)", "s", _get("share_visible", "max_s"), "≤ 2"),
    ("shares over policy budget", "%", _percent("overshoot_policy", "worst"), "≤ 5"),
    ("shares over cluster cap", "%", _percent("overshoot_cluster"), "≤ 5"),
    ("writes/writer/ckpt", "", _get("writes_per_writer_per_checkpoint"), "≤ 3"),
    ("… with lease renewals", "", _get("with_lease_renewals"), "≤ 3"),
    ("largest object", "KiB", _largest_kib, "≤ 100"),
    ("operator RSS", "MiB", _get("operator_rss_mib"), "≤ 300"),
    ("operator CPU/round", "s", _get("operator_cpu_s_per_round"), "report"),
)


def exponent(x1: float, y1: float | None, x2: float, y2: float | None) -> float | None:
    """k in y ∝ x^k through two points; None where it is undefined."""
    if y1 is None or y2 is None or y1 <= 0 or y2 <= 0 or x1 == x2:
        return None
    return round(math.log(y2 / y1) / math.log(x2 / x1), 2)


def growth(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Exponents over writers (per policy count) and over policies (per writer
    count), among the sizes run with admission where it is deployed (its own
    process) when there are any, else among all."""
    deployed = [r for r in results if r.get("admission_in", "process") == "process"]
    results = deployed or list(results)
    out = []
    for axis, fixed in (("writers", "policies"), ("policies", "writers")):
        for value in sorted({r[fixed] for r in results}):
            line = sorted((r for r in results if r[fixed] == value), key=lambda r: r[axis])
            if len(line) < 2 or line[0][axis] == line[-1][axis]:
                continue
            lo, hi = line[0], line[-1]
            out.append({"axis": axis, fixed: value, "from": lo[axis], "to": hi[axis],
                        "exponents": {name: exponent(lo[axis], read(lo), hi[axis], read(hi))
                                      for name, _, read, _ in FIGURES}})
    return out


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:g}"


def markdown(results: Sequence[dict[str, Any]]) -> str:
    """One row per size, then one row per growth line."""
    head = ["writers", "policies", "admission in",
            *(f"{n} ({u})" if u else n for n, u, _, _ in FIGURES)]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head),
            "| target | | | " + " | ".join(t for *_, t in FIGURES) + " |"]
    for r in results:
        rows.append(f"| {r['writers']} | {r['policies']} | "
                    f"{r.get('admission_in', 'process')} | "
                    + " | ".join(_cell(read(r)) for _, _, read, _ in FIGURES) + " |")
    lines = growth(results)
    if lines:
        rows += ["", "Growth exponent k (figure ∝ size^k) between the smallest and largest size:",
                 "", "| axis | from → to | " + " | ".join(n for n, *_ in FIGURES) + " |",
                 "|" + " --- |" * (len(FIGURES) + 2)]
        for g in lines:
            fixed = "policies" if g["axis"] == "writers" else "writers"
            rows.append(f"| {g['axis']} (at {g[fixed]} {fixed}) | {g['from']} → {g['to']} | "
                        + " | ".join(_cell(g["exponents"][n]) for n, *_ in FIGURES) + " |")
    return "\n".join(rows) + "\n"
