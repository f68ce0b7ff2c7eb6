"""How GCS's JSON API writes times (RFC 3339), read by the gs:// store. Pure.
(Its CRC32Cs are S3's wire form: checksum.to_b64 / from_b64.)"""

from __future__ import annotations

import datetime as dt


def when(text: object) -> float | None:
    """Unix seconds of an RFC 3339 time (`updated`), None if it is not one."""
    try:
        return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
