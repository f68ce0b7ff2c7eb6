"""usable_cpus: affinity, lowered by a cgroup v2 or v1 CPU quota."""

from __future__ import annotations

import os
from pathlib import Path

from ckptdrain import cpus


def _affinity() -> int:
    return len(os.sched_getaffinity(0))


def test_no_cgroup_files_means_the_affinity(tmp_path: Path) -> None:
    assert cpus.usable_cpus(tmp_path) == _affinity()


def test_a_v2_quota_rounds_up_and_never_exceeds_the_affinity(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cpus.usable_cpus(tmp_path) == min(2, _affinity())
    (tmp_path / "cpu.max").write_text("1000 100000\n")
    assert cpus.usable_cpus(tmp_path) == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpus.usable_cpus(tmp_path) == _affinity()


def test_a_v1_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpus.usable_cpus(tmp_path) == 1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpus.usable_cpus(tmp_path) == _affinity()


def test_garbage_is_no_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("lots\n")
    assert cpus.usable_cpus(tmp_path) == _affinity()
