"""Housekeeping of the file:// store: what killed writers leave behind.

A put writes `.ckptdrain-tmp-<random>` beside its target and renames it; an
upload is a directory under `.ckptdrain-multipart/`. A process killed
mid-way leaves a temp file, an upload directory without its `key` (killed
while creating it), or a half-deleted one. Removal of an upload therefore
renames it to `trash-<id>-<random>` first (one atomic step: the upload is
gone), then deletes the tree; `sweep` finishes whatever was cut short.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

RESERVED_PREFIX = ".ckptdrain-"
TMP_PREFIX = RESERVED_PREFIX + "tmp-"
TRASH_PREFIX = "trash-"
_UPLOAD_ID_RE = re.compile(r"[0-9a-f]{32}")


def discard_upload(path: Path) -> None:
    """Remove an upload directory: rename it to trash (atomic), then delete it."""
    trash = path.with_name(f"{TRASH_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return  # removed meanwhile
    shutil.rmtree(trash, ignore_errors=True)


def upload_dirs(multipart_dir: Path) -> Iterator[tuple[str, Path]]:
    """(upload id, directory) of every upload directory, live or half made."""
    try:
        entries = list(os.scandir(multipart_dir))
    except FileNotFoundError:
        return
    for entry in entries:
        if _UPLOAD_ID_RE.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
            yield entry.name, Path(entry.path)


def _age(path: str | Path, now: float) -> float:
    try:
        return now - os.lstat(path).st_mtime
    except FileNotFoundError:
        return -1.0


def _prune_empty_parents(path: Path, root: Path) -> None:
    parent = path.parent
    while parent != root and root in parent.parents:
        try:
            parent.rmdir()
        except OSError:
            return
        parent = parent.parent


def sweep(root: Path, multipart_dir: Path, older_than: float, now: float | None = None,
          under: tuple[Path, ...] | None = None) -> int:
    """Remove temp files (under the directories `under`, default: all of
    `root`), trash and key-less uploads older than `older_than` seconds."""
    now = time.time() if now is None else now
    removed = 0
    for trash in multipart_dir.glob(f"{TRASH_PREFIX}*") if multipart_dir.is_dir() else ():
        shutil.rmtree(trash, ignore_errors=True)  # already removed, as far as anyone knows
        removed += 1
    for _, path in upload_dirs(multipart_dir):
        if not (path / "key").exists() and _age(path, now) > older_than:
            discard_upload(path)
            removed += 1
    walked = [(dirpath, filenames) for top in (under or (root,))
              for dirpath, _, filenames in os.walk(top)]
    for dirpath, filenames in walked:
        for name in filenames:
            if not name.startswith(TMP_PREFIX):
                continue
            tmp = Path(dirpath) / name
            if _age(tmp, now) > older_than:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
                    removed += 1
                if multipart_dir not in tmp.parents:
                    _prune_empty_parents(tmp, root)
    return removed
