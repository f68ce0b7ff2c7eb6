"""How often a refused client certificate is said in the log: the first
one at once, then at most one line per interval, counting the refusals it
stands for. A forger who retries in a loop would otherwise write a warning
per connection, fast enough to drown the log and the disk under it.

Pure: the clock is passed in; a lock makes it safe across the server's
connection threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: At most one warning line per this many seconds after the first.
REFUSAL_LOG_INTERVAL_S = 60.0


class RefusalLog:
    """Counts refusals; `note()` says when one must be logged, and for how many."""

    def __init__(self, interval_s: float = REFUSAL_LOG_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self.clock = interval_s, clock
        self._lock = threading.Lock()
        self._last_logged: float | None = None
        self._unlogged = 0

    def note(self) -> int:
        """Count one refusal. Returns how many refusals the line logged now
        stands for (this one and those not yet said), or 0: say nothing."""
        with self._lock:
            self._unlogged += 1
            now = self.clock()
            if self._last_logged is not None and now - self._last_logged < self.interval_s:
                return 0
            count, self._unlogged, self._last_logged = self._unlogged, 0, now
            return count
