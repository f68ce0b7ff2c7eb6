"""This pod's bandwidth share, read from a file the operator rewrites.

The operator feeds the pod annotation `ckptdrain.io/bandwidth` through a
downward-API volume; the kubelet swaps the file atomically when the
annotation changes. The agent re-reads it every second and hands the rate to
the drain's token bucket, so a change takes effect within 2 s. A missing or
malformed file falls back to the policy's default rate with a warning, and
never to unlimited: an unthrottled drain would starve the training job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ckptdrain import units
from ckptdrain.errors import InvalidInput

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0


@dataclass(frozen=True)
class Share:
    rate: float  # bytes/s, always > 0
    source: str  # "file" or "default"
    problem: str | None = None  # why the default is in use


def parse_share(text: str) -> float:
    """A share as the operator writes it (integer bytes/s) or as a person would
    ("50MB/s"). Raises InvalidInput for anything else, zero or negative."""
    return units.parse_rate("bandwidth share", text.strip())


def resolve_share(path: Path | None, default_rate: float) -> Share:
    """The share in force: the file's value, else the default with the reason."""
    if path is None:
        return Share(default_rate, "default", "no share file configured")
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Share(default_rate, "default", f"{path} does not exist")
    except OSError as err:
        return Share(default_rate, "default", f"{path}: {err.strerror or err}")
    try:
        return Share(parse_share(text), "file")
    except InvalidInput as err:
        return Share(default_rate, "default", f"{path}: {err}")


class ShareWatcher:
    """Polls the share file and hands each change to `apply(share)`."""

    def __init__(
        self,
        path: Path | None,
        default_rate: float,
        apply: Callable[[Share], None],
        *,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self.path = path
        self.default_rate = default_rate
        self._apply = apply
        self._poll = poll_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.current = self.refresh()

    def refresh(self) -> Share:
        """Read once and apply if changed; warn once per distinct problem."""
        share = resolve_share(self.path, self.default_rate)
        previous = getattr(self, "current", None)
        if previous is None or share != previous:
            if share.problem:
                log.warning("bandwidth share: using default %s (%s)",
                            units.format_rate(share.rate), share.problem)
            else:
                log.info("bandwidth share: %s from %s", units.format_rate(share.rate), self.path)
            self._apply(share)
        self.current = share
        return share

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="share-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            try:
                self.refresh()
            except Exception:  # a bad read must never stop the watcher
                log.exception("bandwidth share: refresh failed; keeping %s",
                              units.format_rate(self.current.rate))
