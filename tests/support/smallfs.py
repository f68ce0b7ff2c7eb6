"""A real, small filesystem for disk-full tests: a tmpfs of a given size.

Mounting needs root; elsewhere the test is skipped with one line saying so
(the fault-injecting tests beside it still run).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of `size` (e.g. "8m") at `path` for the duration of the block."""
    if os.geteuid() != 0:
        pytest.skip(f"a {size} tmpfs needs root (mount -t tmpfs -o size={size})")
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                           str(path)], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def used_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize
