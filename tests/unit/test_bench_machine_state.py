"""benchmarks/machine_state: the machine a benchmark ran in, read from
/proc text, and the page cache dropped where the kernel lets us."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks.machine_state import (
    drop_page_cache,
    parse_loadavg,
    parse_meminfo,
    parse_uptime,
    read_state,
)

MEMINFO = """\
MemTotal:       24684084 kB
MemFree:        14427500 kB
MemAvailable:   24064084 kB
Buffers:          114872 kB
Cached:          8901824 kB
SwapCached:            0 kB
Active(file):    3131084 kB
Dirty:               168 kB
HugePages_Total:       0
"""


def test_meminfo_fields_are_read_in_bytes() -> None:
    assert parse_meminfo(MEMINFO) == {
        "total": 24684084 * 1024, "free": 14427500 * 1024, "available": 24064084 * 1024,
        "buffers": 114872 * 1024, "cached": 8901824 * 1024, "dirty": 168 * 1024}


def test_a_field_the_kernel_does_not_report_is_left_out_not_guessed() -> None:
    # Kernels before 3.14 have no MemAvailable.
    old = "\n".join(line for line in MEMINFO.splitlines() if "Available" not in line)
    assert "available" not in parse_meminfo(old)
    assert parse_meminfo(old)["free"] == 14427500 * 1024


def test_a_garbled_meminfo_line_is_named() -> None:
    with pytest.raises(ValueError, match="Cached:   lots"):
        parse_meminfo("MemFree: 1 kB\nCached:   lots\n")


def test_uptime_and_load_are_read() -> None:
    assert parse_uptime("12050.50 12720.44\n") == 12050.5
    assert parse_loadavg("0.05 0.70 1.04 1/84 13861\n") == (0.05, 0.70, 1.04)
    with pytest.raises(ValueError, match="/proc/uptime"):
        parse_uptime("")


def test_the_state_is_read_from_the_proc_it_is_given(tmp_path: Path) -> None:
    (tmp_path / "sys" / "kernel").mkdir(parents=True)
    (tmp_path / "uptime").write_text("7200.0 100.0\n")
    (tmp_path / "meminfo").write_text(MEMINFO)
    (tmp_path / "loadavg").write_text("1.50 0.70 1.04 1/84 13861\n")
    (tmp_path / "sys" / "kernel" / "osrelease").write_text("6.18.44\n")
    state = read_state(tmp_path)
    assert (state.uptime_s, state.kernel, state.load[0]) == (7200.0, "6.18.44", 1.5)
    line = state.describe()
    assert line.startswith("up 2h00m, load 1.50,")
    assert "free 13.8 available 22.9 cached 8.5" in line
    assert state.to_json()["memory"]["cached"] == 8901824 * 1024


def test_the_cache_is_dropped_by_writing_3(tmp_path: Path) -> None:
    control = tmp_path / "drop_caches"
    control.write_text("")
    drop = drop_page_cache(control)
    assert drop.dropped and drop.describe() == "cache dropped"
    assert control.read_text() == "3\n"


@pytest.mark.parametrize("where", ["missing/drop_caches", "."])
def test_a_refused_drop_says_why_and_does_not_raise(tmp_path: Path, where: str) -> None:
    # A path nobody can write, root included (as a read-only /proc/sys is).
    control = tmp_path / where
    drop = drop_page_cache(control)
    assert not drop.dropped
    assert drop.describe().startswith(f"cache not dropped: {control}: ")
    assert drop.why.split(": ", 1)[1]  # the kernel's reason, not empty
