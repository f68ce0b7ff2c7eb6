"""Replication: after a step is durable locally, send it to this writer's holder.

Newest first: only the newest local step is ever sent (an older one is
superseded before it would help anyone). The rate comes from the sizing model
with the *local* interval, so that one step reaches the partner within
`overlap` of the local interval, and is enforced by a token bucket of its own,
apart from the drain's. A SIGTERM stops a send within one chunk (1 MiB): the
flush gets the disk and the network, and the partner never publishes a
half-sent copy. A failed send is retried with back-off, and a new holder
(re-pairing) gets the newest step again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ckptdrain import sizing
from ckptdrain.contract.peers import PeerView
from ckptdrain.errors import CkptdrainError
from ckptdrain.node.durable import CopyAborted
from ckptdrain.node.localtier import LocalTier
from ckptdrain.peer.client import PeerClient, Sent
from ckptdrain.ratelimit import TokenBucket

log = logging.getLogger(__name__)

#: Never slower than this (bytes/s): a tiny step must not take minutes.
MIN_RATE = 1e6
MAX_BACKOFF = 60.0


def replication_rate(step_bytes: int, local_interval_s: float, overlap: float) -> float:
    """Bytes/s that send this writer's step of `step_bytes` within `overlap` × the
    local interval (sizing.peer_bandwidth), never below MIN_RATE."""
    return max(MIN_RATE, sizing.peer_bandwidth(max(1, step_bytes), local_interval_s, overlap))


class Replicator:
    def __init__(self, tier: LocalTier, writer: int, view: Callable[[], PeerView | None],
                 client_for: Callable[[str], PeerClient], *, interval_s: float, overlap: float,
                 stop: threading.Event,
                 on_sent: Callable[[Sent, float, tuple[int, str | None]], None] | None = None,
                 poll: float = 1.0) -> None:
        self.tier = tier
        self.writer = writer
        self.view = view
        self.client_for = client_for
        self.interval_s = interval_s
        self.overlap = overlap
        self.stop = stop
        self.on_sent = on_sent
        self.poll = poll
        self.bucket = TokenBucket(MIN_RATE)
        #: (holder address, step) last sent, so a new holder gets the newest again.
        self.sent: tuple[str, int] | None = None
        self.last_error: str | None = None
        self._thread: threading.Thread | None = None

    def pending(self) -> tuple[str, int] | None:
        """(holder address, step) that should be sent now, or None."""
        found = self._pending()
        return None if found is None else found[:2]

    def _pending(self) -> tuple[str, int, tuple[int, str | None]] | None:
        """(holder address, step, (holder rank, its node)) that should be sent now, or None."""
        steps = self.tier.steps()
        view = self.view()
        if not steps or view is None:
            return None
        holder = view.holder(self.writer)
        address = view.address(holder)
        if address is None or holder is None:
            return None
        if (address, steps[0]) == self.sent:
            return None
        return address, steps[0], (holder, view.node(holder))

    def run_once(self) -> Sent | None:
        found = self._pending()
        if found is None:
            return None
        address, step, holder = found
        want = (address, step)
        manifest = self.tier.manifest(step)
        self.bucket.set_rate(replication_rate(manifest.total_bytes, self.interval_s,
                                              self.overlap))
        sent = self.client_for(address).send_step(self.tier, step, self.writer,
                                                  bucket=self.bucket,
                                                  should_stop=self.stop.is_set)
        self.sent = want
        self.last_error = None
        log.info("step %d %s %s (%d bytes)", step,
                 "replicated to" if sent.new else "already held by", address, sent.bytes)
        if self.on_sent is not None:
            self.on_sent(sent, manifest.created, holder)
        return sent

    def run(self) -> None:
        backoff = 0.0
        while not self.stop.is_set():
            try:
                self.run_once()
                backoff = 0.0
            except CopyAborted:
                log.info("replication stopped for the SIGTERM flush")
                return
            except (CkptdrainError, OSError) as err:
                backoff = min(MAX_BACKOFF, max(1.0, 2 * backoff))
                if str(err) != self.last_error:
                    log.warning("replication failed, retrying in %.0fs: %s", backoff, err)
                self.last_error = str(err)
            self.stop.wait(max(self.poll, backoff))

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="peer-replicator", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def lag_seconds(self, now: float | None = None) -> float:
        """Age of the newest local step not yet held by the partner (0 when it is)."""
        steps = self.tier.steps()
        if not steps or (self.sent is not None and self.sent[1] >= steps[0]):
            return 0.0
        try:
            created = self.tier.manifest(steps[0]).created
        except CkptdrainError:
            return 0.0
        return max(0.0, (time.time() if now is None else now) - created)
