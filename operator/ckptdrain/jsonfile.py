"""A JSON object from text or a small file: the one reader for the node
side's little documents (restore's result, the resume channel, agreement
Leases' annotations, goodput annotations). Standard library only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def parse_object(text: str | bytes | None, max_chars: int | None = None) -> dict[str, Any] | None:
    """The JSON object `text` holds; None for nothing, too much, or anything
    that is not a JSON object."""
    if not text or (max_chars is not None and len(text) > max_chars):
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def read_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in the file at `path`; None when it cannot be read."""
    try:
        return parse_object(path.read_bytes())
    except OSError:
        return None
