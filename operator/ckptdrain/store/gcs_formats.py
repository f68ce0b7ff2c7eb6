"""How GCS's JSON API writes what the gs:// store reads: CRC32Cs as base64
of their 4 big-endian bytes, times as RFC 3339. Pure."""

from __future__ import annotations

import base64
import datetime as dt


def crc_b64(crc: int) -> str:
    return base64.b64encode(crc.to_bytes(4, "big")).decode()


def crc_from_b64(text: object) -> int | None:
    """The CRC32C GCS reports, or None when it reports none (or nonsense)."""
    try:
        raw = base64.b64decode(str(text), validate=True)
    except (ValueError, TypeError):
        return None
    return int.from_bytes(raw, "big") if len(raw) == 4 else None


def when(text: object) -> float | None:
    """Unix seconds of an RFC 3339 time (`updated`), None if it is not one."""
    try:
        return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
