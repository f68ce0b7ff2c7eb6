"""What docs/csi-driver.md promises a platform: a pod that takes the node
tier as the driver's inline volume is admitted in a namespace enforcing Pod
Security `restricted`, where the same pod with today's hostPath is refused.
The objects are the page's own YAML blocks, applied for real."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_helpers import page_object
from operator_process import repo_root

from support.apiserver import Cluster

PAGE = repo_root() / "docs" / "csi-driver.md"


def of_kind(kind: str) -> dict[str, Any]:
    return page_object(PAGE, kind)


@pytest.fixture
def restricted(cluster: Cluster) -> Iterator[str]:
    """The page's Namespace under a name of this test's own."""
    namespace = of_kind("Namespace")
    name = f"t-{uuid.uuid4().hex[:8]}"
    namespace["metadata"]["name"] = name
    cluster.kubectl("create", "-f", "-", input=json.dumps(namespace))
    yield name
    cluster.kubectl("delete", "-n", name, "pods", "--all", "--wait=false", check=False)
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def create_pod(cluster: Cluster, namespace: str, pod: dict[str, Any]) -> Any:
    pod["metadata"]["namespace"] = namespace
    return cluster.kubectl("create", "-f", "-", input=json.dumps(pod), check=False)


def test_the_csi_volume_pod_is_admitted_under_restricted(cluster: Cluster,
                                                         restricted: str) -> None:
    assert of_kind("Namespace")["metadata"]["labels"] == {
        "pod-security.kubernetes.io/enforce": "restricted"}
    pod = of_kind("Pod")
    assert pod["spec"]["volumes"][0]["csi"]["driver"] == of_kind("CSIDriver")["metadata"]["name"]
    made = create_pod(cluster, restricted, pod)
    assert made.returncode == 0, made.stderr


def test_the_same_pod_with_a_host_path_is_refused(cluster: Cluster, restricted: str) -> None:
    pod = of_kind("Pod")
    pod["spec"]["volumes"][0] = {"name": "ckptdrain-local",
                                 "hostPath": {"path": "/mnt/ckptdrain/team-a/llama-70b",
                                              "type": "DirectoryOrCreate"}}
    made = create_pod(cluster, restricted, pod)
    assert made.returncode != 0
    assert "violates PodSecurity \"restricted" in made.stderr and "hostPath" in made.stderr
