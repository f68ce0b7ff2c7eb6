"""Two operator replicas with Kopf peering (crds/kopf-peering.yaml): exactly
one handles the policies, the other pauses its watches, and both answer
admission (Kopf does not pause its webhook server): the standby injects from
policies it reads from the apiserver, not from its frozen index."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster_helpers import POLICIES, get, policy, wait_for
from operator_process import OperatorProcess, repo_root

from support.apiserver import Cluster

PEERING = "ckptdrain-test-peering"


def test_only_one_replica_is_active(cluster: Cluster, operator: OperatorProcess,
                                    namespace: str, apply: Callable[..., Any],
                                    tmp_path: Path) -> None:
    _peering(cluster)
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
        wait_for(lambda: (get(cluster, namespace, POLICIES, "peered").get("status") or {})
                 .get("phase") == "Ready", what="policy handled")
        # Kopf logs a handler's success once it returns, after the status
        # the handler wrote: wait for the line, then count who logged it.
        def handled() -> list[bool]:
            return ["checkpointpolicy_create' succeeded" in r.tail(1_000_000)
                    for r in replicas]
        wait_for(lambda: any(handled()), what="the create handler's success logged")
        assert handled().count(True) == 1, handled()
        wait_for(lambda: any("now standby" in r.tail(1_000_000) for r in replicas),
                 what="the paused replica to know it is standby")
        for r in replicas:
            response = _review(r, namespace)
            assert response["allowed"] is True, response
            patch = json.loads(base64.b64decode(response["patch"]))
            added = [op["value"] for op in patch if op["path"] == "/spec/initContainers"]
            names = [c["name"] for c in added[0]] if added else []
            assert "ckptdrain-agent" in names, (r.workdir.name, patch)
    finally:
        for r in replicas:
            r.stop()
        operator.start()


def test_a_standby_never_injects_from_its_frozen_index(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any], tmp_path: Path) -> None:
    """A replica that was active holds the policy in its index when it pauses;
    the policy is then deleted. Its index never hears of it (Kopf pauses its
    watches), so it must answer from the apiserver: no policy, no injection."""
    _peering(cluster)
    operator.stop()
    started: list[OperatorProcess] = []

    def replica(name: str, priority: int) -> OperatorProcess:
        r = OperatorProcess(cluster, tmp_path / name, standalone=False,
                            CKPTDRAIN_PEERING=PEERING,
                            CKPTDRAIN_PEERING_PRIORITY=str(priority))
        r.workdir.mkdir()
        started.append(r)
        r.start()
        return r

    try:
        first = replica("first", 1)
        apply(policy("peered"))
        wait_for(lambda: "checkpointpolicy_create' succeeded" in first.tail(1_000_000),
                 what="the first replica to handle the policy")
        # A newcomer that outranks it (priorities are random unless set).
        replica("second", 2)
        wait_for(lambda: "Pausing operations" in first.tail(1_000_000),
                 what="the first replica to pause for the second")
        wait_for(lambda: "now standby" in first.tail(1_000_000),
                 what="the first replica to know it is standby")
        cluster.kubectl("delete", "-n", namespace, POLICIES, "peered")
        wait_for(lambda: cluster.kubectl("get", "-n", namespace, POLICIES, "peered",
                                         check=False).returncode != 0, what="policy gone")
        response = _review(first, namespace)
        # Refused (CKPTDRAIN_UNSELECTED_PODS defaults to Refuse) on the
        # apiserver's word, not injected from the frozen index.
        assert response["allowed"] is False and "patch" not in response, response
        assert "no CheckpointPolicy" in response["status"]["message"], response
    finally:
        for r in started:
            r.stop()
        operator.start()


def _peering(cluster: Cluster) -> None:
    cluster.kubectl("apply", "-f", str(repo_root() / "crds" / "kopf-peering.yaml"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev")
    cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
        "metadata": {"name": PEERING}}))


def _review(replica: OperatorProcess, namespace: str) -> dict[str, Any]:
    """POST a pod CREATE review straight to one replica's webhook server."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "direct", "namespace": namespace,
                        "labels": {"app": "peered", "ckptdrain.io/inject": "true"}},
           "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]}}
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "operation": "CREATE", "namespace": namespace,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "userInfo": {"username": "test"}, "object": pod, "dryRun": True}}
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # self-signed
    url = f"https://127.0.0.1:{replica.env['CKPTDRAIN_WEBHOOK_PORT']}/ckptdrain-inject"
    request = urllib.request.Request(url, json.dumps(review).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:
        return dict(json.loads(answer.read())["response"])
