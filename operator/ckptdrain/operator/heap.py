"""Give the operator's freed heap back to the system, when nothing waits.

What the operator keeps is small (its indexes hold a few hundred bytes per
pod), but what it handles in bursts is not: every pod event is a whole pod
object, parsed, and a checkpoint is thousands of events at once. Once a
burst is handled, that memory is free to the interpreter yet still counted
in the process's resident size, because the allocator keeps freed pages for
reuse: at 1,000 writers, a quarter of the operator's RSS after a round
was such pages (docs/scale.md, "Operator memory"). With the C allocator for every
object (the Deployment sets PYTHONMALLOC=malloc), few malloc arenas, and
`malloc_trim`, the resident size follows what is live.

A trim after a large burst takes its arenas' locks for up to a second
(every free page is handed back one by one), and every allocation of every
thread waits meanwhile, the admission webhook's included. So it runs only
once the operator has been quiet (no pod event, no admission) for a moment,
once per burst, and at least every few minutes under constant load.

On a C library other than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time

#: mallopt's M_ARENA_MAX (malloc.h).
M_ARENA_MAX = -8
#: Arenas for the whole process: the handlers' threads mostly wait on the
#: network, so a few arenas cost no measurable contention, and each arena
#: keeps free pages of its own.
ARENAS = 2
#: Seconds without a pod event or an admission before a trim.
QUIET_S = 1.0
#: A trim at least this often, quiet or not (seconds).
MAX_WAIT_S = 300.0
CHECK_S = 0.25

_log = logging.getLogger(__name__)
_started = threading.Event()
_last_busy = 0.0


def busy() -> None:
    """Something that must not wait just happened (a pod event, an admission)."""
    global _last_busy
    _last_busy = time.monotonic()


def due(now: float, last_busy: float, last_trim: float, busy_at_trim: float) -> bool:
    """Whether to trim now: quiet since the last busy moment, and busy again
    since the last trim; or the last trim too long ago."""
    if now - last_trim >= MAX_WAIT_S:
        return True
    return now - last_busy >= QUIET_S and last_busy > busy_at_trim


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
    """Limit the arenas and trim when quiet (once per process); False when
    the C library has no such controls."""
    if _started.is_set():
        return True
    libc = _libc()
    if libc is None:
        return False
    _started.set()
    libc.mallopt(M_ARENA_MAX, ARENAS)

    def loop() -> None:
        pause = threading.Event()
        last_trim = busy_at_trim = time.monotonic()
        while not pause.wait(CHECK_S):
            now, last_busy = time.monotonic(), _last_busy
            if not due(now, last_busy, last_trim, busy_at_trim):
                continue
            try:
                libc.malloc_trim(0)
            except Exception as error:  # never worth stopping the operator for
                _log.debug("malloc_trim failed: %s", error)
                return
            last_trim, busy_at_trim = time.monotonic(), last_busy

    threading.Thread(target=loop, name="ckptdrain-heap-trim", daemon=True).start()
    return True
