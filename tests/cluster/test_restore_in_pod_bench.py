"""The in-pod restore benchmark (benchmarks/restore_in_pod.py) at one round,
on its own apiserver and MinIO: each variant restores and, in a pod, writes
its result on the pod through the apiserver. Figures only, never timings."""

from __future__ import annotations

from pathlib import Path

from benchmarks.restore_in_pod import measure


def test_the_benchmark_restores_in_and_outside_a_pod(tmp_path: Path) -> None:
    out = measure(1, None, tmp_path)
    assert set(out) == {"in a pod", "outside a pod"}
    for figures in out.values():
        assert figures["runs"] == 1
        assert figures["cpu_ms"] > 0 and figures["wall_ms"] > 0
