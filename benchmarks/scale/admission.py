"""Pods created through the real admission webhook at a steady rate, each
with its client-side latency (the webhook's call is inside it).

Each policy's pods belong to an Indexed Job, as a real job's do: the Job
object exists (suspended, so no controller would start pods of its own) and
every pod names it as its controller, so admission reads the owner as it
would in a real cluster."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from cluster_helpers import INJECT, pod


@dataclass(frozen=True)
class Writer:
    """One hollow agent's pod: its policy and rank."""

    policy: str
    rank: int

    @property
    def pod(self) -> str:
        return f"{self.policy}-w{self.rank}"


def body(w: Writer, owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An Indexed Job's pod the policy selects, its rank as the Job index;
    with `owner` (owner_reference), the Job is its controller."""
    made = pod(w.pod, {"app": w.policy, **INJECT}, w.rank, terminationGracePeriodSeconds=3600)
    if owner is not None:
        made["metadata"]["ownerReferences"] = [dict(owner)]
    return made


def create_job(batch: Any, namespace: str, name: str, writers: int) -> dict[str, Any]:
    """A suspended Indexed Job of `writers` pods; its owner reference for them."""
    job = batch.create_namespaced_job(namespace, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"suspend": True, "completionMode": "Indexed", "completions": writers,
                 "parallelism": writers,
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {
                     "restartPolicy": "Never",
                     "containers": [{"name": "trainer", "image": "trainer:1"}]}}}})
    return {"apiVersion": "batch/v1", "kind": "Job", "name": name,
            "uid": job.metadata.uid, "controller": True}


def create_at_rate(core: Any, namespace: str, writers: Sequence[Writer], rate: float,
                   workers: int = 16, owners: Mapping[str, Mapping[str, Any]] | None = None,
                   ) -> tuple[list[float], list[str]]:
    """Create every writer's pod at `rate` per second (owned by its policy's
    Job in `owners`, if there). Returns each creation's latency (seconds, in
    order) and the errors (one line each)."""
    errors: list[str] = []

    def create(w: Writer) -> float:
        start = time.perf_counter()
        try:
            core.create_namespaced_pod(namespace, body(w, (owners or {}).get(w.policy)))
        except Exception as error:  # recorded and reported, never hidden
            errors.append(f"{w.pod}: {getattr(error, 'reason', error)}")
            return -1.0
        return time.perf_counter() - start

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = []
        for i, w in enumerate(writers):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(create, w))
        latencies = [f.result() for f in futures]
    return latencies, errors


def quantiles(samples: Sequence[float]) -> dict[str, float | int]:
    """n, p50, p99 and max in milliseconds (failed creations left out)."""
    ordered = sorted(s for s in samples if s >= 0)
    if not ordered:
        return {"n": 0}

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

    return {"n": len(ordered), "p50_ms": pick(0.5), "p99_ms": pick(0.99),
            "max_ms": round(ordered[-1] * 1000, 2)}
