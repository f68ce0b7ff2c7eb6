"""A CheckpointClass's namespace allow-list (spec.namespaces) through the
real operator, webhooks and apiserver, with the class docs/checkpoint-
classes.md shows in its Tenancy section: a policy of a namespace the class
does not allow is refused naming the field, the class and the label the
namespace lacks; one of an allowed namespace is admitted; relabelling the
namespace, or editing the class, turns it ClassResolved False
(NamespaceNotAllowed) and Invalid, with its pods refused, and back; and
a policy naming no class gets the default class that allows its namespace;
and docs/rbac.md's rules let the operator get a namespace, never list it.

Classes are cluster-scoped and the session's operator serves every test:
each class here is deleted when its test ends."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from cluster_helpers import INJECT, POLICIES, get, pod, policy, wait_for
from documented_rbac import operator_rules
from operator_process import repo_root

from support.apiserver import Cluster

TENANT = "example.com/tenant"


def tenancy_class() -> dict[str, Any]:
    """The Tenancy section's class, as the page shows it."""
    text = (repo_root() / "docs" / "checkpoint-classes.md").read_text()
    section = text[text.index("## Tenancy"):text.index("## Not yet")]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    [cls] = [d for d in yaml.safe_load_all(block) if d and d["kind"] == "CheckpointClass"]
    return dict(cls)


@pytest.fixture
def other_namespace(cluster: Cluster) -> Iterator[str]:
    """A second tenant's namespace, without team A's label."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "-n", name, f"pods,{POLICIES}", "--all", "--wait=false",
                    check=False)
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _label(cluster: Cluster, namespace: str, value: str | None) -> None:
    change = f"{TENANT}={value}" if value is not None else f"{TENANT}-"
    cluster.kubectl("label", "namespace", namespace, "--overwrite", change)


def _classed(name: str, namespace: str, class_name: str | None = "team-a-nvme"
             ) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "localTier": {"path": "/mnt/nvme/fast"},
        "storage": {"uri": f"s3://team-a-checkpoints/{namespace}/{name}",
                    "credentialsSecretRef": {"name": "s3-creds"}}}
    if class_name is not None:
        spec["checkpointClassName"] = class_name
    return policy(name, **spec)


def _apply(cluster: Cluster, namespace: str, body: dict[str, Any]) -> Any:
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body),
                           check=False)


def _resolved(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    status = get(cluster, namespace, POLICIES, name).get("status") or {}
    return next((c for c in status.get("conditions") or []
                 if c["type"] == "ClassResolved"), {})


def _pod_refused(cluster: Cluster, namespace: str) -> str | None:
    """The refusal of a pod of policy `run`, or None (admitted, and deleted
    again) while admission still holds the namespace's older labels."""
    made = cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "name", check=False,
                           input=json.dumps(pod("w-0", {"app": "run", **INJECT},
                                                terminationGracePeriodSeconds=600)))
    if made.returncode != 0:
        return str(made.stderr)
    cluster.kubectl("delete", "-n", namespace, "pod", "w-0", "--wait=true", check=False)
    return None


def _wait_resolved(cluster: Cluster, namespace: str, name: str, status: str) -> dict[str, Any]:
    return wait_for(lambda: _resolved(cluster, namespace, name).get("status") == status
                    and _resolved(cluster, namespace, name),
                    timeout_s=45, what=f"{namespace}/{name} ClassResolved {status}")


def test_another_tenant_is_refused_naming_the_class_and_the_missing_label(
        cluster: Cluster, namespace: str, other_namespace: str,
        classes: Callable[..., None]) -> None:
    classes(tenancy_class())
    _label(cluster, namespace, "team-a")
    _label(cluster, other_namespace, "team-b")
    refused = _apply(cluster, other_namespace, _classed("llama", other_namespace))
    assert refused.returncode != 0
    for part in ("spec.checkpointClassName", "CheckpointClass team-a-nvme",
                 f"{other_namespace} lacks {TENANT}=team-a"):
        assert part in refused.stderr, refused.stderr
    assert cluster.kubectl("get", "-n", other_namespace, POLICIES, "llama",
                           check=False).returncode != 0

    admitted = _apply(cluster, namespace, _classed("llama", namespace))
    assert admitted.returncode == 0, admitted.stderr
    resolved = _wait_resolved(cluster, namespace, "llama", "True")
    assert "CheckpointClass team-a-nvme" in resolved["message"]


def test_a_relabelled_namespace_or_an_edited_class_turns_the_policy_invalid_and_back(
        cluster: Cluster, namespace: str, classes: Callable[..., None]) -> None:
    cls = tenancy_class()
    classes(cls)
    _label(cluster, namespace, "team-a")
    assert _apply(cluster, namespace, _classed("run", namespace)).returncode == 0
    _wait_resolved(cluster, namespace, "run", "True")

    # The namespace relabelled: no class event, the operator's recheck sees it.
    _label(cluster, namespace, "team-b")
    lost = _wait_resolved(cluster, namespace, "run", "False")
    assert lost["reason"] == "NamespaceNotAllowed"
    assert f"{namespace} lacks {TENANT}=team-a" in lost["message"]
    assert get(cluster, namespace, POLICIES, "run")["status"]["phase"] == "Invalid"
    # Its pods are refused, as an invalid policy's are (the default Refuse);
    # the pod's admission may hold a reading of the labels up to 30 s old.
    refused = wait_for(lambda: _pod_refused(cluster, namespace), timeout_s=45,
                       what="pod refused")
    assert "CheckpointClass team-a-nvme does not allow" in refused, refused

    _label(cluster, namespace, "team-a")
    _wait_resolved(cluster, namespace, "run", "True")
    wait_for(lambda: get(cluster, namespace, POLICIES, "run")["status"]["phase"] != "Invalid",
             timeout_s=45, what="valid again")

    # The class edited to another tenant: judged on the class's event.
    cls["spec"]["namespaces"]["selector"]["matchLabels"][TENANT] = "team-c"
    classes(cls)
    edited = _wait_resolved(cluster, namespace, "run", "False")
    assert edited["reason"] == "NamespaceNotAllowed"
    assert f"{TENANT}=team-c" in edited["message"]


def test_a_policy_naming_no_class_gets_the_default_that_allows_its_namespace(
        cluster: Cluster, namespace: str, other_namespace: str,
        classes: Callable[..., None]) -> None:
    restricted = tenancy_class()
    restricted["metadata"]["annotations"] = {"ckptdrain.io/is-default-class": "true"}
    classes(restricted)
    # creationTimestamp has one-second resolution: the open default is younger.
    time.sleep(1.1)
    classes({"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
             "metadata": {"name": "everyone-nvme",
                          "annotations": {"ckptdrain.io/is-default-class": "true"}},
             "spec": {"nodeTier": {"root": "/mnt/nvme"}}})
    _label(cluster, namespace, "team-a")
    _label(cluster, other_namespace, "team-b")
    for where, wanted in ((namespace, "team-a-nvme"), (other_namespace, "everyone-nvme")):
        made = _apply(cluster, where, _classed("plain", where, class_name=None))
        assert made.returncode == 0, made.stderr
        assert get(cluster, where, POLICIES, "plain")["spec"]["checkpointClassName"] == wanted
        assert wanted in _wait_resolved(cluster, where, "plain", "True")["message"]


def test_the_documented_rules_get_a_namespace_and_nothing_more(
        cluster: Cluster, namespace: str) -> None:
    """docs/rbac.md's operator rules, bound as they are documented, let it
    read one namespace's labels by name, and never list or watch them all."""
    user = f"docs-operator-{uuid.uuid4().hex[:6]}"
    meta = {"name": user}
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": meta, "rules": operator_rules(dev_mode=False)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": meta, "subjects": [{"kind": "User", "name": user}],
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": user}}]}))
    try:
        def can(*what: str) -> str:
            return str(cluster.kubectl("auth", "can-i", *what, "--as", user,
                                       check=False).stdout).strip()
        assert wait_for(lambda: can("get", f"namespaces/{namespace}") == "yes",
                        what="get namespaces granted")
        assert (can("list", "namespaces"), can("watch", "namespaces"),
                can("patch", f"namespaces/{namespace}")) == ("no", "no", "no")
    finally:
        cluster.kubectl("delete", "clusterrole,clusterrolebinding", user, check=False)
