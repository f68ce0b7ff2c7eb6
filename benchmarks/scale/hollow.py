"""Hollow agents: one process playing every writer of the job through the
node side's own Kubernetes code, so each API call is the one a real agent
makes (node/kube.py RecordWriter, WriterLease and annotate_own_pod;
agent/kube.py PendingBytesPublisher and tiers_for). Only the data path is
hollow: nothing is captured or uploaded, and time is compressed.

One checkpoint of one writer, as agent/loop.py and agent/drainworker.py
drive it:

    Capturing, Local         two record claims (the first also creates the record)
    Draining + pending bytes the claim, then the pod's pending-bytes annotation
                             (a write only as the drain starts: PendingBytesPublisher
                             is offered the falling count every DRAIN_PERIOD_S of
                             the drain, compressed to `tick_s`, as a real one is)
    commit                   the writer's lease checked (a read: renewed within a
                             third of its duration), the claim Global, pending
                             bytes back to 0

Lease renewals between checkpoints (one write every third of the lease's
duration, node/lease.lease_seconds) are not replayed in real time; run.py
adds them per checkpoint interval.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from benchmarks.scale.admission import Writer
from ckptdrain.agent.kube import PendingBytesPublisher, tiers_for
from ckptdrain.agent.report import CheckpointEvent
from ckptdrain.contract.api import ANNOTATION_RESTORED
from ckptdrain.contract.record import State
from ckptdrain.node.kube import RecordWriter, WriterLease, annotate_own_pod

WRITE_PREFIXES = ("create_", "patch_", "replace_", "delete_")
#: One drain tick of the harness: the real agent looks at its pending bytes
#: every second, but the harness offers them every 5 s of drain time, so a
#: long drain is not hundreds of no-op passes over thousands of agents.
DRAIN_PERIOD_S = 5.0


class Counting:
    """An API object whose write calls are counted (thread-safe), by method and,
    for custom objects, by plural: "patch_namespaced_pod",
    "replace_namespaced_custom_object:leases"."""

    def __init__(self, api: Any, counts: Counter[str], lock: threading.Lock) -> None:
        self._api, self._counts, self._lock = api, counts, lock

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._api, name)
        if not name.startswith(WRITE_PREFIXES):
            return method

        def counted(*args: Any, **kwargs: Any) -> Any:
            key = f"{name}:{args[3]}" if name.endswith("_custom_object") else name
            with self._lock:
                self._counts[key] += 1
            return method(*args, **kwargs)
        return counted


class HollowAgent:
    """One writer: the real record client, lease and pending-bytes publisher."""

    def __init__(self, w: Writer, writers: int, namespace: str, custom: Any,
                 core: Any, lease_s: int) -> None:
        self.w, self.namespace, self.core = w, namespace, core
        self.node = f"node-{w.policy}-{w.rank}"
        self.records = RecordWriter(namespace, w.policy, writers, str(w.rank), api=custom)
        self.lease = WriterLease(namespace, w.policy, w.rank, holder=f"uid-{w.pod}",
                                 api=custom, seconds=lease_s, node=self.node)
        self.pending = PendingBytesPublisher(namespace, w.pod, api=core)

    def claim(self, step: int, state: State, size: int, is_global: bool = False) -> None:
        """What RecordReporter sends for one event (agent/kube.py)."""
        event = CheckpointEvent(step, state, size)
        self.records.report(step, state.value, size, tiers_for(event, is_global),
                            datetime.fromtimestamp(event.at, UTC), self.node)

    def restored(self, step: int) -> bool:
        """What restore leaves on its pod once it placed a checkpoint."""
        return annotate_own_pod(self.namespace, self.w.pod, ANNOTATION_RESTORED,
                                f"step={step} tier=global", api=self.core)


class Fleet:
    """Every hollow agent, driven phase by phase on a bounded thread pool."""

    def __init__(self, writers: Sequence[Writer], writers_per_policy: dict[str, int],
                 namespace: str, api_client: Any, threads: int = 32,
                 lease_s: int = 60) -> None:
        from kubernetes import client

        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        lock = threading.Lock()
        self._lock = lock
        custom = Counting(client.CustomObjectsApi(api_client), self.counts, lock)
        core = Counting(client.CoreV1Api(api_client), self.counts, lock)
        self.agents = [HollowAgent(w, writers_per_policy[w.policy], namespace, custom, core,
                                   lease_s) for w in writers]
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="hollow")

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    def each(self, act: Callable[[HollowAgent], object]) -> None:
        """Run `act` for every agent; an agent's error is counted, never raised
        (a real agent logs it and goes on)."""
        def safe(agent: HollowAgent) -> None:
            try:
                act(agent)
            except Exception as error:
                with self._lock:
                    self.errors[f"{type(error).__name__}: {getattr(error, 'reason', '')}"] += 1
        list(self.pool.map(safe, self.agents))

    def start(self) -> None:
        """A job starting: every restore annotates its pod, every agent takes its lease."""
        self.each(lambda a: a.restored(0))
        self.each(lambda a: a.lease.renew())

    def renew_leases(self) -> None:
        self.each(lambda a: a.lease.renew())

    def checkpoint(self, step: int, shard_bytes: int, ticks: int, tick_s: float) -> None:
        """One checkpoint round of every writer (module docstring)."""
        def capture(a: HollowAgent) -> None:
            a.claim(step, State.CAPTURING, 0)
            a.claim(step, State.LOCAL, shard_bytes)

        def drain(a: HollowAgent) -> None:
            a.claim(step, State.DRAINING, shard_bytes)
            a.pending.publish(shard_bytes)

        def commit(a: HollowAgent) -> None:
            a.lease.check()
            a.claim(step, State.GLOBAL, shard_bytes, is_global=True)
            a.pending.publish(0)

        self.each(capture)
        self.each(drain)
        for left in drain_ticks(shard_bytes, ticks):
            time.sleep(tick_s)
            self.each(lambda a, left=left: a.pending.publish(left))
        self.each(commit)


def drain_ticks(shard_bytes: int, ticks: int) -> Iterable[int]:
    """Pending bytes at each publish period of a drain that empties at an even
    rate over `ticks` periods (the last, 0, is the commit's)."""
    return [int(shard_bytes * (ticks - i) / ticks) for i in range(1, ticks)]


def realistic_ticks(shard_bytes: float, share_bytes_s: float, cap: int = 60) -> int:
    """How many DRAIN_PERIOD_S a real drain of one shard at its share lasts."""
    seconds = shard_bytes / max(share_bytes_s, 1.0)
    return max(1, min(cap, round(seconds / DRAIN_PERIOD_S)))
