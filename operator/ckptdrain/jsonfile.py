"""A JSON object from text or a small file: the one reader and writer for
the node side's little documents (restore's result, the resume channel, the
trainer's control files, agreement Leases' annotations, goodput
annotations). Standard library only."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ckptdrain import group_access

#: Distinct temporary names for write_json_atomic within one thread.
_TMP_NAMES = itertools.count()


def parse_object(text: str | bytes | None, max_chars: int | None = None) -> dict[str, Any] | None:
    """The JSON object `text` holds; None for nothing, too much, or anything
    that is not a JSON object."""
    if not text or (max_chars is not None and len(text) > max_chars):
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested too deep to read
        return None
    return doc if isinstance(doc, dict) else None


def read_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in the file at `path`; None when it cannot be read."""
    try:
        return parse_object(path.read_bytes())
    except OSError:
        return None


def write_json_atomic(path: Path, doc: Mapping[str, object]) -> None:
    """Replace `path` so readers see the old or the new content, never a mix;
    the file and a directory made for it are shared with the pod's group."""
    group_access.make_dir(path.parent)
    # One name per call, not per thread: a signal handler may write the same
    # file while the code it interrupted is half-way through writing it.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}."
                         f"{next(_TMP_NAMES)}.tmp")
    try:
        tmp.write_text(json.dumps(doc, sort_keys=True))
        group_access.share(tmp)
        os.replace(tmp, path)
    except BaseException:  # also SystemExit raised by a handler mid-write
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
