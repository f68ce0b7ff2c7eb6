"""Paths from manifests are data from the network: validate before use.

A relative path is accepted only if it is non-empty, '/'-separated, has no
empty, '.', '..' or NUL components, no backslashes, and is not absolute.
`resolve_under` refuses anything that would land outside the destination,
including through a symlink already present there.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ckptdrain.errors import UnsafePath

MAX_PATH_BYTES = 4096


def check_relative_path(path: object) -> str:
    """Return `path` if it is a safe relative '/'-path, else raise UnsafePath."""
    if not isinstance(path, str) or not path:
        raise UnsafePath(f"manifest path must be a non-empty string, got {path!r}")
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise UnsafePath(f"manifest path longer than {MAX_PATH_BYTES} bytes: {path[:64]!r}…")
    if "\x00" in path:
        raise UnsafePath(f"manifest path contains NUL: {path!r}")
    if "\\" in path:
        raise UnsafePath(f"manifest path contains a backslash: {path!r}")
    if path.startswith("/"):
        raise UnsafePath(f"manifest path is absolute: {path!r}")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise UnsafePath(f"manifest path has an empty, '.' or '..' component: {path!r}")
    return path


def check_path_set(paths: Iterable[str]) -> None:
    """Refuse duplicates and a path that is both a file and a directory."""
    seen: set[str] = set()
    for path in paths:
        check_relative_path(path)
        if path in seen:
            raise UnsafePath(f"manifest lists a path twice: {path!r}")
        seen.add(path)
    for path in seen:
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in seen:
                raise UnsafePath(
                    f"manifest path {path!r} needs {'/'.join(parts[:i])!r} to be a directory,"
                    " but it is also listed as a file"
                )


def resolve_under(root: str | os.PathLike[str], path: str) -> Path:
    """The absolute location of `path` inside `root`, refusing escapes.

    Every existing component below `root` must be a real directory (not a
    symlink), so a link planted in the destination cannot redirect a write.
    """
    check_relative_path(path)
    base = Path(root).resolve()
    target = base.joinpath(*path.split("/"))
    current = base
    for part in path.split("/")[:-1]:
        current = current / part
        if current.is_symlink() or (current.exists() and not current.is_dir()):
            raise UnsafePath(f"{path!r}: {current} is a symlink or not a directory")
    if target.is_symlink():
        raise UnsafePath(f"{path!r}: destination is a symlink")
    if os.path.commonpath([base, target.parent.resolve()]) != str(base):
        raise UnsafePath(f"{path!r} would land outside {base}")
    return target
