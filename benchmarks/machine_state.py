"""The state of the machine a benchmark ran in, and the page cache dropped
for a fresh-boot-like round.

A figure measured on a machine up for days with 8 GiB of page cache says
nothing about a node that just booted: the tools' binaries, the Python
libraries and their bytecode are read from disk on the first run. So a
report states, at its start and before each round, the uptime, the load and
how much memory was free, available and cached; and a cold round drops the
page cache first (`sync; echo 3 > /proc/sys/vm/drop_caches`), where the
kernel lets us. Files on tmpfs (/dev/shm) are not page cache that can be
dropped: a dataset there stays in memory.

The parsers take the text of /proc files, so they are tested on strings;
`read_state` and `drop_page_cache` take the paths they touch.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")
DROP_CACHES = PROC / "sys" / "vm" / "drop_caches"
#: The /proc/meminfo fields a report keeps, in its own names (bytes).
MEMINFO_FIELDS = {"MemTotal": "total", "MemFree": "free", "MemAvailable": "available",
                  "Cached": "cached", "Buffers": "buffers", "Dirty": "dirty"}
_UNITS = {"kB": 1024, "B": 1}


def parse_uptime(text: str) -> float:
    """Seconds since boot, from /proc/uptime ("12050.50 12720.44")."""
    try:
        return float(text.split()[0])
    except (IndexError, ValueError):
        raise ValueError(f"/proc/uptime: expected '<seconds> <idle seconds>', "
                         f"got {text!r}") from None


def parse_meminfo(text: str) -> dict[str, int]:
    """MEMINFO_FIELDS in bytes, from /proc/meminfo ("MemFree:  14427500 kB").
    A field the kernel does not report is left out, not guessed."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name not in MEMINFO_FIELDS:
            continue
        words = rest.split()
        if not words or not words[0].isdigit() or (len(words) > 1 and words[1] not in _UNITS):
            raise ValueError(f"/proc/meminfo: expected '{name}: <number> kB', got {line!r}")
        out[MEMINFO_FIELDS[name]] = int(words[0]) * _UNITS[words[1] if len(words) > 1 else "B"]
    return out


def parse_loadavg(text: str) -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages, from /proc/loadavg."""
    try:
        one, five, fifteen = (float(x) for x in text.split()[:3])
    except ValueError:
        raise ValueError(f"/proc/loadavg: expected three load averages, got {text!r}") from None
    return one, five, fifteen


@dataclass(frozen=True)
class MachineState:
    uptime_s: float
    memory: dict[str, int]  # MEMINFO_FIELDS' names -> bytes
    cpus: int
    load: tuple[float, float, float]
    kernel: str

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "load": list(self.load)}

    def describe(self) -> str:
        """One line: uptime, load, and the memory free, available and cached."""
        def gib(field: str) -> str:
            value = self.memory.get(field)
            return "?" if value is None else f"{value / (1 << 30):.1f}"
        hours, rest = divmod(int(self.uptime_s), 3600)
        return (f"up {hours}h{rest // 60:02d}m, load {self.load[0]:.2f}, memory GiB free "
                f"{gib('free')} available {gib('available')} cached {gib('cached')} "
                f"dirty {self.memory.get('dirty', 0) / (1 << 20):.0f} MiB")


def read_state(proc: Path = PROC) -> MachineState:
    """The machine's state now, from `proc` (a /proc)."""
    return MachineState(
        uptime_s=parse_uptime((proc / "uptime").read_text()),
        memory=parse_meminfo((proc / "meminfo").read_text()),
        cpus=os.cpu_count() or 0,
        load=parse_loadavg((proc / "loadavg").read_text()),
        kernel=(proc / "sys" / "kernel" / "osrelease").read_text().strip())


@dataclass(frozen=True)
class CacheDrop:
    """Whether the page cache was dropped, and if not, why."""
    dropped: bool
    why: str = ""

    def describe(self) -> str:
        return "cache dropped" if self.dropped else f"cache not dropped: {self.why}"


def drop_page_cache(control: Path = DROP_CACHES) -> CacheDrop:
    """sync, then write 3 (page cache, dentries and inodes) to `control`.
    Never raises: a benchmark where the kernel refuses (no root, a read-only
    /proc/sys in a container) still runs its cold rounds, marked as such."""
    os.sync()  # only clean pages are dropped: dirty ones would stay cached
    try:
        with open(control, "w") as f:
            f.write("3\n")
    except OSError as e:
        return CacheDrop(False, f"{control}: {e.strerror or e}")
    return CacheDrop(True)
