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


def control(made: dict[str, Any]) -> dict[str, Any]:
    """The same pod without the label that opts it in: the webhook never sees
    it, so its creation is the apiserver's alone."""
    labels = {k: v for k, v in made["metadata"]["labels"].items() if k not in INJECT}
    return {**made, "metadata": {**made["metadata"], "name": made["metadata"]["name"] + "-c",
                                 "labels": labels}}


def create_at_rate(core: Any, namespace: str, writers: Sequence[Writer], rate: float,
                   workers: int = 16, owners: Mapping[str, Mapping[str, Any]] | None = None,
                   ) -> tuple[list[float], list[str]]:
    """Create every writer's pod at `rate` per second (owned by its policy's
    Job in `owners`, if there). Returns each creation's latency (seconds, in
    order) and the errors (one line each)."""
    latencies, _, errors = _create(core, namespace, writers, rate, workers, owners, False)
    return latencies, errors


def create_with_controls(core: Any, namespace: str, writers: Sequence[Writer], rate: float,
                         owners: Mapping[str, Mapping[str, Any]] | None = None,
                         ) -> tuple[list[float], list[float], list[str]]:
    """As create_at_rate, each writer's pod followed by its control (the
    same pod, not opted in), `rate` creations per second in all: the
    latencies of the pods, of the controls, and the errors. What admission
    through the webhook adds is the difference, at the same moment."""
    return _create(core, namespace, writers, rate, 16, owners, True)


def _create(core: Any, namespace: str, writers: Sequence[Writer], rate: float, workers: int,
            owners: Mapping[str, Mapping[str, Any]] | None, controls: bool,
            ) -> tuple[list[float], list[float], list[str]]:
    errors: list[str] = []

    def create(w: Writer, plain: bool) -> float:
        made = body(w, (owners or {}).get(w.policy))
        start = time.perf_counter()
        try:
            core.create_namespaced_pod(namespace, control(made) if plain else made)
        except Exception as error:  # recorded and reported, never hidden
            errors.append(f"{w.pod}{'-c' if plain else ''}: {getattr(error, 'reason', error)}")
            return -1.0
        return time.perf_counter() - start

    order = [(w, plain) for w in writers for plain in ((False, True) if controls else (False,))]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = []
        for i, (w, plain) in enumerate(order):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            futures.append((plain, pool.submit(create, w, plain)))
        done = [(plain, f.result()) for plain, f in futures]
    return ([t for plain, t in done if not plain], [t for plain, t in done if plain], errors)


def quantiles(samples: Sequence[float]) -> dict[str, float | int]:
    """n, p50, p99 and max in milliseconds (failed creations left out)."""
    ordered = sorted(s for s in samples if s >= 0)
    if not ordered:
        return {"n": 0}

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

    return {"n": len(ordered), "p50_ms": pick(0.5), "p99_ms": pick(0.99),
            "max_ms": round(ordered[-1] * 1000, 2)}
