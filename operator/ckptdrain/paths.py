"""Paths from manifests are data from the network: validate before use.

A relative path is accepted only if it is non-empty, valid UTF-8,
'/'-separated, has no empty, '.' or '..' components, no NUL or backslash,
and is not absolute. An object key (`check_key`) follows the same rule, with
S3's length limit and the file:// store's reserved names.
`resolve_under` refuses anything that would land outside the destination,
including through a symlink already present there.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ckptdrain.errors import UnsafePath

MAX_PATH_BYTES = 4096
#: S3's limit on a key, prefix included.
MAX_KEY_BYTES = 1024
#: Names under this prefix are the file:// store's own (temp files, multipart
#: state); no key may use it, so a key valid on one store is valid on all.
RESERVED_PREFIX = ".ckptdrain-"


def _check(text: object, what: str, max_bytes: int, reserved: str | None) -> str:
    """The one rule for relative '/'-paths from the network (manifest paths, object keys)."""
    if not isinstance(text, str) or not text:
        raise UnsafePath(f"{what} must be a non-empty string, got {text!r}")
    if "\x00" in text:
        raise UnsafePath(f"{what} contains NUL: {text!r}")
    if "\\" in text:
        raise UnsafePath(f"{what} contains a backslash: {text!r}")
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafePath(f"{what} is not valid UTF-8: {text!r}") from None
    if len(encoded) > max_bytes:
        raise UnsafePath(f"{what} longer than {max_bytes} bytes: {text[:64]!r}…")
    if text.startswith("/"):
        raise UnsafePath(f"{what} is absolute: {text!r}")
    for part in text.split("/"):
        if part in ("", ".", ".."):
            raise UnsafePath(f"{what} has an empty, '.' or '..' component: {text!r}")
        if reserved and part.startswith(reserved):
            raise UnsafePath(f"{what} uses the reserved prefix {reserved}: {text!r}")
    return text


def check_relative_path(path: object) -> str:
    """Return `path` if it is a safe relative '/'-path, else raise UnsafePath."""
    return _check(path, "manifest path", MAX_PATH_BYTES, None)


def check_key(key: object) -> str:
    """Return `key` if it is a safe object key (for every store), else raise UnsafePath:
    the path rules, at most 1024 UTF-8 bytes, and no `.ckptdrain-` component."""
    return _check(key, "object key", MAX_KEY_BYTES, RESERVED_PREFIX)


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
