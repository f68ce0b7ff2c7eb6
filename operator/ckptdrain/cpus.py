"""How many CPUs this process may really use: what sizes its thread pools."""

from __future__ import annotations

import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def usable_cpus(cgroup: Path = CGROUP) -> int:
    """CPUs this process may use: its affinity, lowered by a cgroup CPU quota
    (a pod limited to one CPU on a large node counts one, not the node's)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = _quota(cgroup)
    if quota is not None:
        cpus = min(cpus, quota)
    return max(1, cpus)


def _quota(cgroup: Path) -> int | None:
    """The CPU quota in whole CPUs (rounded up), from cgroup v2 or v1; None: unlimited."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()
    except (OSError, ValueError):
        try:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    try:
        if quota in ("max", "-1") or int(period) <= 0:
            return None
        return max(1, -(-int(quota) // int(period)))
    except ValueError:
        return None
