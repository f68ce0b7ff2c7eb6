"""A CheckpointClass's placement (spec.nodeTier.nodeSelector, tolerations)
through the real operator, its admission webhook and apiserver, with the
class docs/checkpoint-classes.md shows (its Placement section): a selected
pod is stored with the class's nodeSelector merged into its own and the
class's tolerations added once; a pod whose nodeSelector or required node
affinity asks for other nodes than the class's is refused (422), naming
the field, the class and what was expected. The page's command lists the
class's pods; an edit of the class's nodeSelector is a PlacementChanged
Event on the policy naming its live pod; a policy whose placement no class
node meets is refused."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from cluster_helpers import INJECT, POLICIES, get, pod, policy, wait_for
from kubernetes import client, config
from operator_process import repo_root

from support.apiserver import Cluster


def placement_class() -> dict[str, Any]:
    """The Placement section's class, as the page shows it."""
    text = (repo_root() / "docs" / "checkpoint-classes.md").read_text()
    section = text[text.index("## Placement"):text.index("## Not yet")]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    [cls] = [d for d in yaml.safe_load_all(block) if d and d["kind"] == "CheckpointClass"]
    return dict(cls)


def listing_script() -> str:
    """The page's command listing the pods of a class's policies (before an edit)."""
    text = (repo_root() / "docs" / "checkpoint-classes.md").read_text()
    section = text[text.index("## Placement"):text.index("## Not yet")]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


CLASS = placement_class()
ROOT = CLASS["spec"]["nodeTier"]["root"]
[NVME] = CLASS["spec"]["nodeTier"]["tolerations"]


def _create(cluster: Cluster, namespace: str, body: dict[str, Any]) -> Any:
    return cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "json",
                           input=json.dumps(body), check=False)


def _resolved(cluster: Cluster, namespace: str, name: str) -> bool:
    status = get(cluster, namespace, POLICIES, name).get("status") or {}
    return any(c["type"] == "ClassResolved" and c["status"] == "True"
               for c in status.get("conditions") or [])


def test_a_selected_pod_is_placed_on_the_class_nodes_or_refused(
        cluster: Cluster, namespace: str, classes: Callable[..., None],
        apply: Callable[..., Any]) -> None:
    classes(CLASS)
    apply(policy("placed", checkpointClassName="nvme-pool", writers=3,
                 localTier={"path": f"{ROOT}/p"}))
    wait_for(lambda: _resolved(cluster, namespace, "placed"), what="ClassResolved True")

    labels = {"app": "placed", **INJECT}
    bare = _create(cluster, namespace, pod("w-0", labels, 0, terminationGracePeriodSeconds=600))
    assert bare.returncode == 0, bare.stderr
    spec = json.loads(bare.stdout)["spec"]
    assert spec["nodeSelector"] == {"example.com/pool": "nvme"}
    assert NVME in spec["tolerations"]

    own = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    mixed = _create(cluster, namespace, pod(
        "w-1", labels, 1, terminationGracePeriodSeconds=600,
        nodeSelector={"gpu": "h100", "example.com/pool": "nvme"}, tolerations=[own, NVME]))
    assert mixed.returncode == 0, mixed.stderr
    spec = json.loads(mixed.stdout)["spec"]
    assert spec["nodeSelector"] == {"gpu": "h100", "example.com/pool": "nvme"}
    assert [t for t in spec["tolerations"] if t in (own, NVME)] == [own, NVME]

    elsewhere = _create(cluster, namespace, pod(
        "w-2", labels, 2, terminationGracePeriodSeconds=600,
        nodeSelector={"example.com/pool": "hdd"}))
    assert elsewhere.returncode != 0
    for said in ("spec.nodeSelector.example.com/pool", "CheckpointClass nvme-pool",
                 "example.com/pool=nvme"):
        assert said in elsewhere.stderr, elsewhere.stderr

    # Its own required node affinity rules out the class's nodes: refused
    # as it reaches the apiserver, the requirement named.
    core = client.CoreV1Api(config.new_client_from_config(str(cluster.kubeconfig)))
    hdd = {"key": "example.com/pool", "operator": "In", "values": ["hdd"]}
    with pytest.raises(client.exceptions.ApiException) as refused:
        core.create_namespaced_pod(namespace, pod(
            "w-3", labels, 2, terminationGracePeriodSeconds=600, affinity={"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [hdd]}]}}}))
    assert refused.value.status == 422, refused.value
    for said in ("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                 ".nodeSelectorTerms[0].matchExpressions[0]", "CheckpointClass nvme-pool",
                 "example.com/pool=nvme", "example.com/pool In [hdd]"):
        assert said in (refused.value.body or ""), refused.value.body


def test_the_page_lists_the_class_pods_and_a_contradicting_policy_is_refused(
        cluster: Cluster, namespace: str, classes: Callable[..., None],
        apply: Callable[..., Any]) -> None:
    classes(CLASS)
    apply(policy("listed", checkpointClassName="nvme-pool", localTier={"path": f"{ROOT}/l"}))
    wait_for(lambda: _resolved(cluster, namespace, "listed"), what="ClassResolved True")
    labels = {"app": "listed", **INJECT}
    assert _create(cluster, namespace, pod("l-0", labels,
                                           terminationGracePeriodSeconds=600)).returncode == 0
    env = {**cluster.env(), "PATH": f"{cluster.binaries.kubectl.parent}:{os.environ['PATH']}"}
    listed = subprocess.run(["bash", "-euo", "pipefail", "-c", listing_script()], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert listed.returncode == 0, listed.stderr
    assert f"{namespace} l-0 example.com/pool=nvme -/-" in listed.stdout.splitlines()

    # The class moves its pods to another pool: the live pod is named on its policy.
    moved = json.loads(json.dumps(CLASS))
    moved["spec"]["nodeTier"]["nodeSelector"] = {"example.com/pool": "nvme2"}
    classes(moved)

    def warned() -> list[str]:
        events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o",
                                            "json").stdout)["items"]
        return [e["message"] for e in events if e.get("reason") == "PlacementChanged"
                and e["involvedObject"]["name"] == "listed"]

    [message] = wait_for(warned, what="a PlacementChanged Event on the policy")
    for said in ("1 live pod(s) (l-0)", "example.com/pool=nvme ", "CheckpointClass nvme-pool",
                 "example.com/pool=nvme2"):
        assert said in message, message

    # Required to run where the class's pods never are: refused by the class.
    hdd = policy("hdd", checkpointClassName="nvme-pool", localTier={"path": f"{ROOT}/h"},
                 placement={"nodeAffinity": {"matchExpressions": [
                     {"key": "example.com/pool", "operator": "In", "values": ["hdd"]}]}})
    created = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(hdd),
                              check=False)
    assert created.returncode != 0, created.stdout
    for said in ("spec.placement.nodeAffinity.matchExpressions[0]", "CheckpointClass nvme-pool",
                 "example.com/pool=nvme"):
        assert said in created.stderr, created.stderr
