"""The agent's side of the peer tier at run time: the replicator sending this
writer's newest local step to its holder, and its metrics. (The server that
holds partners' copies is its own sidecar, peer/command.py: it must be up
before restore, and the agent starts after it.) `start` returns None when
the peer tier is off.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from prometheus_client import Counter, Gauge

from ckptdrain.agent.drainworker import DrainWorker
from ckptdrain.agent.metrics import AgentMetrics
from ckptdrain.agent.report import CheckpointEvent, Reporter, State
from ckptdrain.node.config import AgentConfig
from ckptdrain.node.localtier import LocalTier
from ckptdrain.peer import config as peer_config
from ckptdrain.peer.client import PeerClient, Sent
from ckptdrain.peer.replicator import Replicator

log = logging.getLogger(__name__)


class HeldSteps:
    """This writer's steps its holder has confirmed, and which rank holds each
    (for the records' `peer` tier and `peerHolder`)."""

    def __init__(self) -> None:
        self._steps: dict[int, tuple[int, str | None]] = {}
        self._lock = threading.Lock()

    def __contains__(self, step: object) -> bool:
        with self._lock:
            return step in self._steps

    def holder_of(self, step: int) -> tuple[int, str | None] | None:
        """(rank, node) of the holder that confirmed `step` (None: none did)."""
        with self._lock:
            return self._steps.get(step)

    def recorder(self, tier: LocalTier, reporter: Reporter, drain: DrainWorker | None
                 ) -> Callable[[int, tuple[int, str | None]], None]:
        """What to call when the holder confirms `step`: remember it, and re-claim
        the step with the `peer` tier when no drain event will (a step that is
        not global and not being drained stays Local; a draining one gets
        `peer` with its next event)."""
        def held(step: int, holder: tuple[int, str | None]) -> None:
            with self._lock:
                self._steps[step] = holder
                local = tier.steps()
                if local:  # forget what retention removed
                    self._steps = {s: h for s, h in self._steps.items() if s >= local[-1]}
            busy = drain.busy_steps() if drain is not None else set()
            if tier.has(step) and not tier.is_global(step) and step not in busy:
                reporter.report(CheckpointEvent(step, State.LOCAL, tier.bytes_of(step),
                                                message="copy held by the partner"))
        return held


def start(cfg: AgentConfig, tier: LocalTier, metrics: AgentMetrics,
          terminating: threading.Event,
          on_held: Callable[[int, tuple[int, str | None]], None] | None = None,
          ) -> Replicator | None:
    """Start the replicator (None when the peer tier is off). It stops when
    `terminating` is set: the SIGTERM flush has the disk and network to itself."""
    pcfg = peer_config.load(cfg.policy)
    if pcfg is None:
        return None
    sent_bytes = Counter("ckptdrain_peer_sent_bytes", "Bytes replicated to the partner",
                         registry=metrics.registry)
    lag = Gauge("ckptdrain_peer_lag_seconds",
                "Age of the newest local step the partner does not hold yet (0: it does)",
                registry=metrics.registry)

    def on_sent(sent: Sent, created: float, holder: tuple[int, str | None]) -> None:
        if sent.new:
            sent_bytes.inc(sent.bytes)
        metrics.recovery_point("peer", sent.step, created)
        if on_held is not None:
            on_held(sent.step, holder)

    replicator = Replicator(tier, cfg.writer, pcfg.view,
                            lambda address: PeerClient(address, pcfg.credentials),
                            interval_s=cfg.interval_s, overlap=cfg.overlap,
                            stop=terminating, on_sent=on_sent)
    lag.set_function(replicator.lag_seconds)
    replicator.start()
    log.info("peer tier on: replicating to the holder named in %s", pcfg.peers_file)
    return replicator
