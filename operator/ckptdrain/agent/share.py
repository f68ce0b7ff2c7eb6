"""This pod's bandwidth share: from its policy's share channel, else from
the file the webhook wrote at admission.

The channel (contract/share.py, watched by agent/share_channel.py) is how
shares move during a drain: the agent derives its own share the moment the
operator publishes a change, and waits while it is counted but not yet
admitted, so the shares of a policy never add up to more than its budget.
The file (the pod annotation `ckptdrain.io/bandwidth`, which the webhook
sets to the pod's part of the joint budget, through a downward-API volume)
is the fallback: when the agent cannot watch the channel (no rights, the
apiserver away) or is not admitted within `ADMIT_TIMEOUT_S` (the operator
down). A missing or malformed file falls back to the policy's default rate
with a warning, and never to unlimited: an unthrottled drain would starve
the training job. The agent re-evaluates every second and on every channel
event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ckptdrain import units
from ckptdrain.contract import share as sh
from ckptdrain.errors import InvalidInput

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
#: A drainer the channel has not admitted by then falls back to its file
#: share (the operator may be down); said in the log and the metric.
ADMIT_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Share:
    rate: float  # bytes/s, always > 0
    source: str  # "channel", "waiting", "file" or "default"
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


@dataclass(frozen=True)
class ChannelView:
    """What the agent knows of its share channel at one moment."""

    #: The watch is established and current (False: no rights, no apiserver).
    live: bool
    allocation: sh.Allocation | None
    #: Whether this agent has bytes to drain, and since when (monotonic).
    draining: bool
    draining_since: float | None


def resolve_channel(view: ChannelView, me_rank: int | None, me_pod: str, now: float,
                    fallback: Share) -> Share:
    """The share in force given the channel, else `fallback` (the file's)."""
    if not view.live:
        return fallback
    if view.allocation is not None and view.allocation.admits(me_rank, me_pod):
        return Share(view.allocation.share(), "channel")
    if not view.draining:
        # Nothing to send: the rate does not matter until a drain starts.
        return fallback
    waited = 0.0 if view.draining_since is None else now - view.draining_since
    if waited < ADMIT_TIMEOUT_S:
        return Share(sh.PAUSED_RATE, "waiting", "counted, not yet admitted by the channel")
    return Share(fallback.rate, fallback.source,
                 f"not admitted by the share channel within {ADMIT_TIMEOUT_S:.0f} s"
                 f" (is the operator running?); {fallback.problem or 'the file share'}")


class ShareWatcher:
    """Re-evaluates the share every `poll_seconds` (and whenever `refresh` is
    called, as the channel's watch does on each event) and hands each change
    to `apply(share)`."""

    def __init__(
        self,
        path: Path | None,
        default_rate: float,
        apply: Callable[[Share], None],
        *,
        poll_seconds: float = POLL_SECONDS,
        channel: Callable[[], ChannelView] | None = None,
        rank: int | None = None,
        pod: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.default_rate = default_rate
        self._apply = apply
        self._poll = poll_seconds
        self._channel = channel
        self._rank, self._pod, self._clock = rank, pod, clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.current = self.refresh()

    def attach(self, channel: Callable[[], ChannelView], rank: int | None, pod: str) -> None:
        """Take shares from a channel from now on (the file stays the fallback)."""
        self._channel, self._rank, self._pod = channel, rank, pod
        self.refresh()

    def refresh(self) -> Share:
        """Evaluate once and apply if changed; log once per distinct problem."""
        with self._lock:
            share = resolve_share(self.path, self.default_rate)
            if self._channel is not None:
                share = resolve_channel(self._channel(), self._rank, self._pod,
                                        self._clock(), share)
            previous = getattr(self, "current", None)
            if previous is None or share != previous:
                self._log(share, previous)
                self._apply(share)
            self.current = share
            return share

    def _log(self, share: Share, previous: Share | None) -> None:
        rate = units.format_rate(share.rate)
        if share.source == "waiting":
            log.info("bandwidth share: waiting to be admitted by the share channel")
        elif share.problem and (previous is None or previous.problem != share.problem):
            log.warning("bandwidth share: using %s %s (%s)", share.source, rate, share.problem)
        elif share.source == "channel":
            # Publications are coalesced by the operator: a few per checkpoint.
            log.info("bandwidth share: %s from the share channel", rate)
        elif not share.problem:
            log.info("bandwidth share: %s from %s", rate, self.path)

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
