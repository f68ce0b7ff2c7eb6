"""The records the collector keeps in each policy directory, read back
(collector.py writes them): the deleted-since clock and the reclaim
recorded from the policy's class. Reading only; what a record's absence or
damage means is collection.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

from ckptdrain.csi import class_reclaim
from ckptdrain.csi.class_reclaim import RECLAIM_FILE
from ckptdrain.csi.collection import DeletedClock, Recorded, Unreadable

DELETED_SINCE_FILE = "deleted-since.json"


def read_clock(directory: Path) -> DeletedClock | None:
    """The clock on disk; None when there is none or it cannot be read (the
    clock then starts again, which only delays a deletion)."""
    try:
        found = json.loads((directory / DELETED_SINCE_FILE).read_text())
        since = found["since"]
        last = found.get("last", since)  # a file without it: the run starts again
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not all(isinstance(t, int | float) and not isinstance(t, bool) for t in (since, last)):
        return None
    return DeletedClock(float(since), float(last))


def read_recorded(directory: Path) -> Recorded | Unreadable | None:
    """The reclaim recorded for the directory; None when there is none (the
    driver's setting then applies), Unreadable when one is there but cannot
    be read or parsed (held: never the driver's setting)."""
    try:
        text = (directory / RECLAIM_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        return Unreadable(str(err))
    return class_reclaim.loads(text)
