"""Hollow agents: one process playing every writer of the job through the
node side's own Kubernetes code, so each API call is the one a real agent
makes (node/kube.py WriterLease and annotate_own_pod; agent/kube.py
PodReport). Only the data path is hollow: nothing is captured or uploaded,
and time is compressed (each agent's PodReport runs on a clock the harness
moves).

One checkpoint of one writer, as agent/loop.py and agent/drainworker.py
drive it, each state reported to the agent's PodReport, which decides what
is written to the pod (progress and pending bytes in one patch):

    Capturing, Local         reported (Local is due a write SETTLE_S later)
    Draining + pending bytes reported; the drain's start is written at once,
                             with the progress so far (PodReport is offered
                             the falling count every DRAIN_PERIOD_S of the
                             drain, compressed to `tick_s`, as a real one is)
    commit                   the writer's lease checked (reads: renewed within
                             30 s, or confirmed by reading it and the node's
                             heartbeat, which the harness renews before each
                             commit as the kubelet would, uncounted), Global
                             reported, pending bytes back to 0; the clock
                             moves SETTLE_S and the one patch goes

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
from ckptdrain.agent.kube import SETTLE_S, PodReport
from ckptdrain.agent.report import CheckpointEvent
from ckptdrain.contract.api import ANNOTATION_RESTORED
from ckptdrain.contract.record import State
from ckptdrain.node.kube import WriterLease, annotate_own_pod
from ckptdrain.node.lease import LEASE_API, LEASE_PLURAL, MICROTIME, NODE_LEASE_NAMESPACE

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
    """One writer: the real pod report and lease, on a clock the harness moves."""

    def __init__(self, w: Writer, writers: int, namespace: str, custom: Any,
                 core: Any, lease_s: int) -> None:
        self.w, self.namespace, self.core = w, namespace, core
        self.node = f"node-{w.policy}-{w.rank}"
        self.now = 0.0
        self.globals: set[int] = set()
        self.pending = PodReport(namespace, w.pod, w.rank, writers, api=core,
                                 is_global=self.globals.__contains__,
                                 clock=lambda: self.now)
        self.lease = WriterLease(namespace, w.policy, w.rank, holder=f"uid-{w.pod}",
                                 api=custom, seconds=lease_s, node=self.node)

    def claim(self, step: int, state: State, size: int) -> None:
        """One state of one step, as the agent's loop and drain report it."""
        if state is State.GLOBAL:
            self.globals.add(step)
        self.pending.report(CheckpointEvent(step, state, size))

    def tick(self, pending: int, advance: float = 1.0) -> None:
        """One look of the PodReport's thread, `advance` seconds after the last."""
        self.now += advance
        self.pending.tick(pending)

    def heartbeat(self, api: Any) -> None:
        """What this writer's kubelet does every 10 s: renew its node's lease
        (kube-node-lease/<node>), which the writer lease's check reads. Not
        an agent's write: the harness makes it uncounted, once per phase."""
        from kubernetes.client.exceptions import ApiException

        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.node},
                "spec": {"holderIdentity": self.node, "leaseDurationSeconds": 40,
                         "renewTime": datetime.now(UTC).strftime(MICROTIME)}}
        try:
            api.patch_namespaced_custom_object(*LEASE_API, NODE_LEASE_NAMESPACE, LEASE_PLURAL,
                                               self.node, {"spec": body["spec"]})
        except ApiException as error:
            if error.status != 404:
                raise
            api.create_namespaced_custom_object(*LEASE_API, NODE_LEASE_NAMESPACE,
                                                LEASE_PLURAL, body)

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
        self.kubelets = client.CustomObjectsApi(api_client)  # uncounted: not ours
        custom = Counting(self.kubelets, self.counts, lock)
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
        self.each(lambda a: a.heartbeat(self.kubelets))
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
            a.tick(shard_bytes)

        def commit(a: HollowAgent) -> None:
            a.lease.check()
            a.claim(step, State.GLOBAL, shard_bytes)
            a.tick(0)
            a.tick(0, SETTLE_S)  # Global and the drain's end, together

        self.each(capture)
        self.each(drain)
        for left in drain_ticks(shard_bytes, ticks):
            time.sleep(tick_s)
            self.each(lambda a, left=left: a.tick(left, DRAIN_PERIOD_S))
        self.each(lambda a: a.heartbeat(self.kubelets))  # the kubelets are alive
        self.each(commit)


def drain_ticks(shard_bytes: int, ticks: int) -> Iterable[int]:
    """Pending bytes at each publish period of a drain that empties at an even
    rate over `ticks` periods (the last, 0, is the commit's)."""
    return [int(shard_bytes * (ticks - i) / ticks) for i in range(1, ticks)]


def realistic_ticks(shard_bytes: float, share_bytes_s: float, cap: int = 60) -> int:
    """How many DRAIN_PERIOD_S a real drain of one shard at its share lasts."""
    seconds = shard_bytes / max(share_bytes_s, 1.0)
    return max(1, min(cap, round(seconds / DRAIN_PERIOD_S)))
