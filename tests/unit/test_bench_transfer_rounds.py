"""benchmarks/transfer_rounds and transfer_report: warm and cold rounds,
interleaved, summed up and printed apart."""

from __future__ import annotations

from typing import Any

import pytest
from benchmarks.transfer_report import ratio_lines, round_lines, throughput_lines
from benchmarks.transfer_rounds import COLD, WARM, by_kind, round_kinds
from hypothesis import given
from hypothesis import strategies as st


def test_cold_rounds_are_spread_among_the_warm_ones() -> None:
    assert round_kinds(3, 1) == [WARM, COLD, WARM, WARM]
    assert round_kinds(1, 1) == [WARM, COLD]
    assert round_kinds(4, 2) == [WARM, COLD, WARM, COLD, WARM, WARM]
    assert round_kinds(3, 0) == [WARM] * 3


@given(st.integers(1, 12), st.integers(0, 12))
def test_every_round_is_run_once_and_the_first_is_warm(warm: int, cold: int) -> None:
    kinds = round_kinds(warm, cold)
    assert kinds.count(WARM) == warm and kinds.count(COLD) == cold
    assert kinds[0] == WARM


def test_negative_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="-1 cold"):
        round_kinds(3, -1)


def _run(tool: str, round_: int, kind: str, mbps: float, cpu: float = 1.0,
         starved: bool = False) -> dict[str, Any]:
    return {"tool": tool, "direction": "download", "round": round_, "kind": kind,
            "bytes_per_second": mbps * 1e6, "cpu_core_seconds_per_gb": cpu,
            "peak_rss_bytes": 1, "starved": starved}


RUNS = [_run("ckptdrain", 0, WARM, 900), _run("s5cmd", 0, WARM, 600),
        _run("ckptdrain", 1, COLD, 300, cpu=3.0), _run("s5cmd", 1, COLD, 400),
        _run("ckptdrain", 2, WARM, 1000), _run("s5cmd", 2, WARM, 500)]


def test_warm_and_cold_runs_are_summed_up_apart() -> None:
    kinds = by_kind(RUNS, ["ckptdrain", "s5cmd"])
    warm, cold = kinds[WARM], kinds[COLD]
    assert warm["tools"]["ckptdrain.download"]["bytes_per_second"] == {
        "median": 950e6, "min": 900e6, "max": 1000e6}
    assert cold["tools"]["ckptdrain.download"]["bytes_per_second"]["median"] == 300e6
    # Ratios pair runs of one round: warm 1.5 and 2.0, cold 0.75, never mixed.
    assert warm["ratios"]["ckptdrain.download"]["rounds"] == 2
    assert warm["ratios"]["ckptdrain.download"]["throughput"] == {
        "median": 1.75, "min": 1.5, "max": 2.0}
    assert cold["ratios"]["ckptdrain.download"]["throughput"]["median"] == 0.75
    assert cold["ratios"]["ckptdrain.download"]["cpu_per_gb"]["median"] == 3.0


def test_a_run_without_cold_rounds_reports_no_cold_kind() -> None:
    assert set(by_kind([r for r in RUNS if r["kind"] == WARM], ["ckptdrain", "s5cmd"])) == {WARM}


def test_the_printed_report_sets_warm_beside_cold() -> None:
    kinds = by_kind(RUNS, ["ckptdrain", "s5cmd"])
    line = next(x for x in throughput_lines(kinds) if "ckptdrain.download" in x)
    assert line.index("950 (900–1000)") < line.index("300 (300–300)")
    ratios = ratio_lines(kinds)
    at = next(i for i, x in enumerate(ratios) if "ckptdrain.download" in x)
    assert "warm 1.75× (1.50–2.00) the throughput" in ratios[at]
    assert "cold 0.75× (0.75–0.75) the throughput" in ratios[at + 1]
    warm_only = ratio_lines(by_kind(RUNS[:2], ["ckptdrain", "s5cmd"]))
    assert warm_only[1].strip() == "cold —"


def test_each_round_prints_its_state_and_a_refused_drop() -> None:
    state = {"uptime_s": 5400.0, "load": [0.5, 0.5, 0.5],
             "memory": {"free": 2 << 30, "available": 6 << 30, "cached": 3 << 30}}
    lines = round_lines([
        {"round": 0, "kind": WARM, "state_before": state},
        {"round": 1, "kind": COLD, "state_before": state,
         "cache": "cache not dropped: /proc/sys/vm/drop_caches: Read-only file system"}])
    assert "cache not dropped: /proc/sys/vm/drop_caches: Read-only file system" in lines[1]
    assert "cache not dropped" not in lines[0]
    assert "up 1.5 h, load 0.50, GiB free 2.0 available 6.0 cached 3.0" in lines[0]
