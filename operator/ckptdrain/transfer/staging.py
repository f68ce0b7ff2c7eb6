"""Where a pull stages a checkpoint before it is verified and renamed into
place (beside `dest`, named after the pulling process), and the removal of
what killed pulls left there."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path


def staging_prefix(dest: Path, pid: int) -> str:
    # The pid says whose it is: a pull killed mid-way leaves its staging
    # directory, and the next pull beside DEST removes it once that pid is gone.
    return f".{dest.name}.ckptdrain-{pid}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def remove_stale_staging(dest: Path) -> int:
    """Remove staging directories that killed pulls into `dest` left beside it
    (their process is gone, or is this one: in a container a restarted pull
    may get its predecessor's PID, and this process has no other pull into
    `dest` under way); return how many went."""
    pattern = re.compile(re.escape(f".{dest.name}.ckptdrain-") + r"([0-9]+)-")
    removed = 0
    for entry in os.scandir(dest.parent):
        match = pattern.match(entry.name)
        pid = int(match[1]) if match else 0
        if match and entry.is_dir(follow_symlinks=False) and (
                pid == os.getpid() or not _alive(pid)):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
    return removed
