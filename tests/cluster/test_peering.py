"""Two operator replicas with Kopf peering (crds/kopf-peering.yaml): exactly
one handles the policies, the other pauses."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster_helpers import get, policy, wait_for
from operator_process import OperatorProcess, repo_root

from support.apiserver import Cluster

PEERING = "ckptdrain-test-peering"


def test_only_one_replica_is_active(cluster: Cluster, operator: OperatorProcess,
                                    namespace: str, apply: Callable[..., Any],
                                    tmp_path: Path) -> None:
    cluster.kubectl("apply", "-f", str(repo_root() / "crds" / "kopf-peering.yaml"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev")
    cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
        "metadata": {"name": PEERING}}))
    operator.stop()
    replicas = [OperatorProcess(cluster, tmp_path / f"r{i}", standalone=False,
                                CKPTDRAIN_PEERING=PEERING) for i in range(2)]
    try:
        for r in replicas:
            r.workdir.mkdir()
            r.start()
        peers = wait_for(lambda: len(json.loads(cluster.kubectl(
            "get", "clusterkopfpeering", PEERING, "-o", "json").stdout).get("status") or {})
            == 2, what="two peers announced")
        assert peers
        wait_for(lambda: any("Pausing operations" in r.tail(100_000) for r in replicas),
                 what="the lower-priority replica to pause")
        apply(policy("peered"))
        wait_for(lambda: (get(cluster, namespace, "ckpol", "peered").get("status") or {})
                 .get("phase") == "Ready", what="policy handled")
        handled = ["checkpointpolicy_create' succeeded" in r.tail(1_000_000)
                   for r in replicas]
        assert handled.count(True) == 1, handled
    finally:
        for r in replicas:
            r.stop()
        operator.start()
