"""Operator benchmarks against a real etcd + kube-apiserver (no kubelet):

1. admission latency of labelled pods created at a steady rate (default
   50/s), client-side, with unlabelled pods (no webhook call) as baseline;
2. time until the share channel counts one more drainer among N (every
   agent's share shrinks with that one write).

Run: .venv/bin/python -m benchmarks.operator_webhook [--rate 50] [--pods 500]
Prints one JSON object. Figures go into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "cluster")]

from cluster_helpers import INJECT, pod, policy  # noqa: E402
from kubernetes import client, config  # noqa: E402
from operator_process import OperatorProcess  # noqa: E402

from support import apiserver  # noqa: E402
from support.conversion_server import converting_crds  # noqa: E402


def _quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(ordered), "p50_ms": round(pick(0.5) * 1000, 2),
            "p99_ms": round(pick(0.99) * 1000, 2), "max_ms": round(ordered[-1] * 1000, 2),
            "mean_ms": round(statistics.fmean(ordered) * 1000, 2)}


def _create_at_rate(core: client.CoreV1Api, namespace: str, bodies: list[dict[str, Any]],
                    rate: float) -> list[float]:
    def create(body: dict[str, Any]) -> float:
        start = time.perf_counter()
        core.create_namespaced_pod(namespace, body)
        return time.perf_counter() - start

    futures = []
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=16) as pool:
        for i, body in enumerate(bodies):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(create, body))
        return [f.result() for f in futures]


def _channel(custom: client.CustomObjectsApi) -> dict[str, Any]:
    """The bench policy's share channel (spec), {} until it exists."""
    try:
        return dict(custom.get_namespaced_custom_object(
            "ckptdrain.io", "v1alpha1", "bench", "checkpointshares", "bench")["spec"])
    except client.exceptions.ApiException:
        return {}


def _wait_channel(custom: client.CustomObjectsApi, drainers: int, admitted: str,
                  timeout_s: float, poll_s: float) -> float:
    """Seconds until the channel counts `drainers` and admits ranks `admitted`; -1 on
    timeout."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        spec = _channel(custom)
        if spec.get("drainers") == drainers and spec.get("activeRanks") == admitted:
            return time.perf_counter() - start
        time.sleep(poll_s)
    return -1.0


def _drain(core: client.CoreV1Api, names: list[str]) -> None:
    """What each agent writes when its drain starts."""
    def one(name: str) -> None:
        core.patch_namespaced_pod(name, "bench", {"metadata": {"annotations": {
            "ckptdrain.io/pending-bytes": "1000000"}}})
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(one, names))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks operator_webhook")
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--pods", type=int, default=500)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="ckptdrain-bench-"))
    crds = [ROOT / "crds" / f"{crd}.yaml"
            for crd in ("checkpointpolicies", "checkpoints", "checkpointshares")]
    # Converting: v1beta1 is stored, and v1alpha1 writes need /convert.
    with apiserver.running(work / "cluster") as cluster, converting_crds(cluster, crds):
        cluster.kubectl("wait", "--for=condition=Established", "crd", "--all")
        (work / "op").mkdir()
        op = OperatorProcess(cluster, work / "op")
        op.start()
        try:
            api = config.new_client_from_config(str(cluster.kubeconfig))
            api.configuration.connection_pool_maxsize = 32
            core = client.CoreV1Api(api)
            cluster.kubectl("create", "namespace", "bench")
            cluster.kubectl("apply", "-n", "bench", "-f", "-", input=json.dumps(
                policy("bench", writers=args.pods + 1, localTier={"path": "/mnt/ckptdrain/x"})))
            time.sleep(2)
            grace = {"terminationGracePeriodSeconds": 3600}
            plain = [pod(f"plain-{i}", {"app": "plain"}) for i in range(args.pods // 5)]
            baseline = _create_at_rate(core, "bench", plain, args.rate)
            # Each pod its own writer rank (a Job index), as admission requires.
            labelled = [pod(f"w-{i}", {"app": "bench", **INJECT}, i, **grace)
                        for i in range(args.pods)]
            injected = _create_at_rate(core, "bench", labelled, args.rate)
            custom = client.CustomObjectsApi(api)
            # Every agent starts a drain at once: all counted, then admitted.
            _drain(core, [f"w-{i}" for i in range(args.pods)])
            settle_s = _wait_channel(custom, args.pods, f"0-{args.pods - 1}", 300, 0.2)
            # One more drainer: every share changes to 63 GB/s / (N+1) the moment
            # the channel counts it (one write, seen by every agent's watch).
            core.create_namespaced_pod("bench", pod("w-extra", {"app": "bench", **INJECT},
                                                    args.pods, **grace))
            _drain(core, ["w-extra"])
            rebalance_s = _wait_channel(custom, args.pods + 1, f"0-{args.pods - 1}", 300,
                                        0.02)
        finally:
            op.stop()
    print(json.dumps({
        "rate_per_s": args.rate, "pods": args.pods,
        "create_unlabelled": _quantiles(baseline),
        "create_injected": _quantiles(injected),
        "shares_settled_after_burst_s": round(settle_s, 2),
        f"rebalance_{args.pods + 1}_pods_s": round(rebalance_s, 2),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
