"""Give the operator's freed heap back to the system.

What the operator keeps is small (its indexes hold a few hundred bytes per
pod), but what it handles in bursts is not: every pod event is a whole pod
object, parsed, and a checkpoint is thousands of events at once. Once a
burst is handled, that memory is free to the interpreter yet still counted
in the process's resident size, because the C allocator keeps freed pages
for reuse: measured at 5,000 writers, four fifths of the operator's RSS was
such pages (docs/scale.md). Two allocator settings make the resident size
follow what is live: few malloc arenas (by default glibc makes up to eight
per core, one for each thread that allocates at the same time, and each
keeps its own free pages), and `malloc_trim` now and then, which returns
free pages in the middle of the heap as well as at its end.

On a C library other than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading

#: mallopt's M_ARENA_MAX (malloc.h).
M_ARENA_MAX = -8
#: Arenas for the whole process: the handlers' threads mostly wait on the
#: network, so a few arenas cost no measurable contention.
ARENAS = 2
#: Seconds between trims. One trim of a few hundred MiB takes milliseconds.
TRIM_PERIOD_S = 10.0

_log = logging.getLogger(__name__)
_started = threading.Event()


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    if not hasattr(libc, "malloc_trim") or not hasattr(libc, "mallopt"):
        return None  # not glibc
    return libc


def trim() -> bool:
    """Return free heap pages to the system now; False without glibc."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def start() -> bool:
    """Limit the arenas and trim periodically (once per process); False
    when the C library has no such controls."""
    if _started.is_set():
        return True
    libc = _libc()
    if libc is None:
        return False
    _started.set()
    libc.mallopt(M_ARENA_MAX, ARENAS)

    def loop() -> None:
        pause = threading.Event()
        while not pause.wait(TRIM_PERIOD_S):
            try:
                libc.malloc_trim(0)
            except Exception as error:  # never worth stopping the operator for
                _log.debug("malloc_trim failed: %s", error)
                return

    threading.Thread(target=loop, name="ckptdrain-heap-trim", daemon=True).start()
    return True
