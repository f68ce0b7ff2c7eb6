"""This pod's bandwidth share: from its policy's share channel, else from
the file the webhook wrote at admission.

The channel (contract/share.py, watched by agent/share_channel.py) is how
shares move during a drain: the agent derives its own share the moment the
operator publishes a change, and waits while it is counted but not yet
admitted, so the shares of a policy never add up to more than its budget.
The file (the pod annotation `ckptdrain.io/bandwidth`, which the webhook
sets to the pod's part of the joint budget, through a downward-API volume)
is the fallback: when the agent cannot watch the channel (no rights, the
apiserver away), when the channel goes quiet while drains run (the operator
down), or when it is not admitted within `ADMIT_TIMEOUT_S`; with a channel
seen, the fallback is at most the channel's budget over its writers. A
missing or malformed file falls back to the policy's default rate with a
warning, and never to unlimited: an unthrottled drain would starve the
training job. The agent re-evaluates every second and on every channel
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

    #: A list of the channel succeeded once (False: never, or no rights).
    established: bool
    #: The watch is down now (the last allocation may be out of date).
    broken: bool
    forbidden: bool
    allocation: sh.Allocation | None
    #: When the last event of the channel arrived (monotonic), heartbeats included.
    received_at: float | None
    #: The allocation admits this pod, and arrived after its drain was reported.
    admitted: bool
    #: Whether this agent has bytes to drain, and since when it waits for admission.
    draining: bool
    waiting_since: float | None
    #: The pod got SIGTERM: its flush does not wait for admission.
    flushing: bool = False
    #: The namespace's cluster scale (None: none published, an older operator).
    scale: sh.Scale | None = None


def resolve_channel(view: ChannelView, now: float, file_share: Share) -> Share:
    """The share in force given the channel (contract/share.py says why each
    rule keeps the sum within the budget), else the file's."""
    a = view.allocation
    fallback = file_share
    cap = a.fallback_cap(view.scale) if a is not None else None
    if cap is not None and fallback.rate > cap:
        fallback = Share(cap, fallback.source, fallback.problem)
    if view.forbidden or not view.established:
        return fallback
    stale = view.broken or (a is not None and a.drainers > 0 and view.received_at is not None
                            and now - view.received_at > sh.DEAD_AFTER_S)
    if view.admitted and a is not None:
        if stale:
            return Share(min(a.share(view.scale), fallback.rate), fallback.source,
                         "share channel not current (watch down, or no word from the "
                         "operator): the smaller of its share and the fallback")
        return Share(a.share(view.scale), "channel")
    if not view.draining:
        return fallback  # nothing to send: the rate does not matter until a drain starts
    if view.flushing:
        return Share(fallback.rate, fallback.source,
                     "SIGTERM flush: not waiting to be admitted by the share channel")
    waited = 0.0 if view.waiting_since is None else now - view.waiting_since
    if waited < sh.ADMIT_TIMEOUT_S:
        return Share(sh.PAUSED_RATE, "waiting", "counted, not yet admitted by the channel")
    return Share(fallback.rate, fallback.source,
                 f"not admitted by the share channel within {sh.ADMIT_TIMEOUT_S:.0f} s "
                 "(is the operator running?)")


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.default_rate = default_rate
        self._apply = apply
        self._poll = poll_seconds
        self._channel = channel
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.current = self.refresh()

    def attach(self, channel: Callable[[], ChannelView]) -> None:
        """Take shares from a channel from now on (the file stays the fallback)."""
        self._channel = channel
        self.refresh()

    def refresh(self) -> Share:
        """Evaluate once and apply if changed; log once per distinct problem."""
        with self._lock:
            share = resolve_share(self.path, self.default_rate)
            if self._channel is not None:
                share = resolve_channel(self._channel(), self._clock(), share)
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
                # Never stay at what may be the paused rate: the file share.
                fallback = resolve_share(self.path, self.default_rate)
                log.exception("bandwidth share: refresh failed; using %s",
                              units.format_rate(fallback.rate))
                try:
                    self._apply(fallback)
                    self.current = fallback
                except Exception:
                    log.exception("bandwidth share: could not apply the fallback")
