"""The chart's policy on the CSI drivers' free-space reports, on a real
apiserver (docs/csi-driver.md, "One node's report, one node's driver").
Every driver holds the same Role, so RBAC alone lets any node's driver
write any node's report: with the policy, a driver's token (bound to its
pod, so to that pod's node) writes its own node's report through the
driver's own code, and is refused another node's (create and update), its
own report relabelled to another node or widened to every node, owned by
another pod or held by a finalizer, and any write without a pod-bound
token; a node name of every length and shape the report's name cuts,
cleans or keeps writes its own report and no other name."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from cluster_helpers import get, page_object, pod, render_chart, wait_for
from kubernetes import client, config
from operator_process import repo_root

from ckptdrain.csi import capacity_report
from ckptdrain.csi.capacity_publisher import CapacityPublisher
from ckptdrain.csi.usage import Capacity
from support.apiserver import Cluster

DRIVER = "node.ckptdrain.io"  # the chart's default csiDriver.name
GB = 10**9
FREE = Capacity(40 * GB, 100 * GB, 1000, 2000)
ApiError = client.exceptions.ApiException
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass
class Release:
    """The chart's policy, installed for a release of the test's own, and
    the driver's ServiceAccount with its documented Role."""

    namespace: str
    account: str


@pytest.fixture
def release(cluster: Cluster, namespace: str) -> Iterator[Release]:
    name = f"cap-{uuid.uuid4().hex[:6]}"
    account = f"{name}-ckptdrain-csi-node"  # the chart's ckptdrain.csiNodeName
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    role = page_object(repo_root() / "docs" / "csi-driver.md", "Role")
    meta = {"name": account, "namespace": namespace}
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
        "items": [{**role, "metadata": meta},
                  {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                   "metadata": meta, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                 "kind": "Role", "name": account},
                   "subjects": [{"kind": "ServiceAccount", "name": account,
                                 "namespace": namespace}]}]}))
    policy = render_chart(name, namespace, ["csi-capacity-policy.yaml"])
    cluster.kubectl("apply", "-f", "-", input=policy)
    try:
        yield Release(namespace, account)
    finally:
        cluster.kubectl("delete", "-f", "-", input=policy, check=False)


@pytest.fixture
def driver_on(cluster: Cluster, release: Release
              ) -> Iterator[Callable[[str], tuple[client.StorageV1Api, tuple[str, str]]]]:
    """A node of that name, a driver Pod scheduled on it, and the StorageV1Api
    of the token the kubelet would mount into that Pod (bound to it, so
    carrying the node's name); with the Pod's (name, uid)."""
    nodes: list[str] = []

    def _driver_on(node: str) -> tuple[client.StorageV1Api, tuple[str, str]]:
        cluster.kubectl("create", "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
        nodes.append(node)
        name = f"csi-node-{uuid.uuid4().hex[:6]}"
        body = pod(name, {"app": "csi-node"}, serviceAccountName=release.account,
                   nodeName=node)
        cluster.kubectl("create", "-n", release.namespace, "-f", "-", input=json.dumps(body))
        uid = get(cluster, release.namespace, "pod", name)["metadata"]["uid"]
        kubeconfig = cluster.kubeconfig_for(release.namespace, release.account,
                                            bound_pod=(name, uid))
        return client.StorageV1Api(config.new_client_from_config(str(kubeconfig))), (name, uid)

    try:
        yield _driver_on
    finally:
        # No kubelet confirms a bound pod's deletion: forced.
        cluster.kubectl("delete", "pods", "--all", "-n", release.namespace, "--force",
                        "--grace-period=0", check=False)
        for node in nodes:
            cluster.kubectl("delete", "node", node, "--wait=false", check=False)


def _report(node: str, namespace: str, **changes: Any) -> dict[str, Any]:
    """`node`'s report as its driver writes it, with `changes` over the top level."""
    return {**capacity_report.build(node, DRIVER, namespace, FREE, time.time(), 600),
            **changes}


def _refusal(write: Callable[[], Any]) -> str:
    """The apiserver's refusal of `write` ('' when it was accepted)."""
    try:
        write()
    except ApiError as err:
        assert err.status == 403, err
        return str(err.body)
    return ""


def _create(api: client.StorageV1Api, body: dict[str, Any], dry_run: bool = False
            ) -> Callable[[], Any]:
    return lambda: api.create_namespaced_csi_storage_capacity(
        body["metadata"]["namespace"], body, **({"dry_run": "All"} if dry_run else {}))


def _replace(api: client.StorageV1Api, cluster: Cluster, body: dict[str, Any]
             ) -> Callable[[], Any]:
    """A replace of the stored object by `body`, at its current version."""
    meta = body["metadata"]
    stored = get(cluster, meta["namespace"], "csistoragecapacities", meta["name"])
    sent = {**body, "metadata": {**meta, "resourceVersion": stored["metadata"][
        "resourceVersion"]}}
    return lambda: api.replace_namespaced_csi_storage_capacity(
        meta["name"], meta["namespace"], sent)


def _wait_in_force(api: client.StorageV1Api, body: dict[str, Any]) -> None:
    """A new policy takes effect within moments: wait until it refuses `body`
    (a dry run: one accepted before the policy is in force stores nothing)."""
    wait_for(lambda: _refusal(_create(api, body, dry_run=True)), what="the policy in force")


def test_a_driver_writes_its_own_nodes_report_and_no_other(
        cluster: Cluster, release: Release, driver_on: Callable[..., Any],
        caplog: pytest.LogCaptureFixture) -> None:
    ns = release.namespace
    node_a, node_b = (f"gpu-{uuid.uuid4().hex[:6]}" for _ in "ab")
    api_a, pod_a = driver_on(node_a)
    _wait_in_force(api_a, _report(node_b, ns))

    # Its own report, saying another node in any field, or every node, or
    # another storage class or driver: refused (dry runs: admission in full,
    # nothing stored). nodeTopology and storageClassName are immutable: only
    # a create sets them.
    own = _report(node_a, ns)
    relabelled = {**own, "metadata": {**own["metadata"], "annotations": {
        **own["metadata"]["annotations"], "ckptdrain.io/node": node_b}}}
    other_driver = {**own, "metadata": {**own["metadata"], "labels": {
        "ckptdrain.io/csi-driver": "other.example.com"}}}
    for body, field in [
        (relabelled, "metadata.annotations[ckptdrain.io/node]"),
        ({**own, "nodeTopology": {"matchLabels": {"kubernetes.io/hostname": node_b}}},
         "nodeTopology"),
        ({**own, "nodeTopology": {}}, "nodeTopology"),  # every node
        ({**own, "nodeTopology": {"matchLabels": {"kubernetes.io/hostname": node_a},
                                  "matchExpressions": [{"key": "kubernetes.io/hostname",
                                                        "operator": "Exists"}]}},
         "nodeTopology"),
        ({k: v for k, v in own.items() if k != "nodeTopology"}, "nodeTopology"),
        ({**own, "storageClassName": "fast-ssd"}, "storageClassName"),
        (other_driver, "metadata.labels[ckptdrain.io/csi-driver]"),
    ]:
        assert f"{field}: expected" in _refusal(_create(api_a, body, dry_run=True)), body

    # The token the kubelet mounts names the node and the pod: the policy
    # trusts these extras, so they are checked here on the real apiserver.
    review = client.AuthenticationV1Api(api_a.api_client).create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    extra = review.status.user_info.extra
    assert (extra["authentication.kubernetes.io/node-name"],
            extra["authentication.kubernetes.io/pod-name"],
            extra["authentication.kubernetes.io/pod-uid"]) == ([node_a], [pod_a[0]], [pod_a[1]])

    # Held past its pod by a finalizer, owned by another pod or by its own
    # and another: refused. Owned by its own pod alone: accepted.
    owner = {"apiVersion": "v1", "kind": "Pod", "name": pod_a[0], "uid": pod_a[1]}
    other_pod = {**owner, "name": "csi-node-other", "uid": str(uuid.uuid4())}
    for metadata, field in [
        ({"finalizers": ["example.com/keep"]}, "metadata.finalizers"),
        ({"ownerReferences": [other_pod]}, "metadata.ownerReferences"),
        ({"ownerReferences": [{**owner, "uid": other_pod["uid"]}]},
         "metadata.ownerReferences"),
        ({"ownerReferences": [owner, other_pod]}, "metadata.ownerReferences"),
        ({"ownerReferences": [owner]}, None),
    ]:
        body = {**own, "metadata": {**own["metadata"], **metadata}}
        said = _refusal(_create(api_a, body, dry_run=True))
        assert (f"{field}: expected none" in said) if field else said == "", (body, said)

    # The driver's own code, with its token and its Pod as the report's
    # owner: created, then replaced.
    clock = iter(range(1_000_000, 2_000_000, 10))
    publisher = CapacityPublisher(api_a, ns, node_a, DRIVER, 600,
                                  clock=lambda: float(next(clock)), owner=pod_a)
    with caplog.at_level(logging.INFO, "ckptdrain.csi.capacity_publisher"):
        publisher(SimpleNamespace(capacity=FREE))
        first = get(cluster, ns, "csistoragecapacities", publisher.name)
        publisher(SimpleNamespace(capacity=FREE))  # the first write, made again
    assert "not published" not in caplog.text, caplog.text
    again = get(cluster, ns, "csistoragecapacities", publisher.name)
    assert again["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]
    assert again["metadata"]["annotations"]["ckptdrain.io/node"] == node_a
    assert [(o["name"], o["uid"]) for o in again["metadata"]["ownerReferences"]] == [pod_a]

    # Another node's report: refused to create, and to update once its own
    # driver (here the admin) has written it, with B's content or A's.
    theirs = _report(node_b, ns)
    assert f"metadata.annotations[ckptdrain.io/node]: expected '{node_a}'" in _refusal(
        _create(api_a, theirs))
    cluster.kubectl("create", "-f", "-", input=json.dumps(theirs))
    assert (f"metadata.annotations[ckptdrain.io/node]: expected '{node_a}', the node the "
            f"writer's token is bound to, got '{node_b}': a CSI driver writes only its own "
            "node's free space") in _refusal(_replace(api_a, cluster, theirs))
    # (Its nodeTopology kept: the field is immutable.)
    mine_in_theirs = {**own, "nodeTopology": theirs["nodeTopology"],
                      "metadata": {**own["metadata"], "name": theirs["metadata"]["name"]}}
    expected_name = capacity_report.object_name(node_a, DRIVER)
    assert f"metadata.name: expected '{expected_name}'" in _refusal(
        _replace(api_a, cluster, mine_in_theirs))
    stored = get(cluster, ns, "csistoragecapacities", theirs["metadata"]["name"])
    assert stored["metadata"]["annotations"]["ckptdrain.io/node"] == node_b

    # Its stored report relabelled to another node, or to another driver: refused.
    for body, field in [(relabelled, "metadata.annotations[ckptdrain.io/node]"),
                        (other_driver, "metadata.labels[ckptdrain.io/csi-driver]")]:
        assert f"{field}: expected" in _refusal(_replace(api_a, cluster, body)), body
    stored = get(cluster, ns, "csistoragecapacities", own["metadata"]["name"])
    assert stored["metadata"]["annotations"]["ckptdrain.io/node"] == node_a

    # A token not bound to a pod carries no node: refused even its "own" report.
    unbound = client.StorageV1Api(config.new_client_from_config(str(
        cluster.kubeconfig_for(ns, release.account))))
    assert "bound to a pod on a node" in _refusal(_replace(unbound, cluster, own))
    assert "bound to a pod on a node" in _refusal(_create(unbound, _report("gpu-x", ns)))


def _node_name(tag: str, length: int, marks: dict[int, str] | None = None) -> str:
    """A node name (a DNS subdomain) of `length` characters: `tag`, then
    'a's with a '.' every 60 (labels stay within 63), then `marks`
    (position: separator characters) over the top."""
    chars = list((tag + "a" * length)[:length])
    for at in range(60, length - 1, 60):
        chars[at] = "."
    for at, mark in (marks or {}).items():
        chars[at:at + len(mark)] = mark
    node = "".join(chars)
    assert len(node) == length and SUBDOMAIN.fullmatch(node), node
    assert max(len(label) for label in node.split(".")) <= 63, node
    return node


#: prefix (17) + node fits the 253 of a name up to a node name of 236; the
#: cleaned name is cut at 225 ([:225]), its last character at 224.
NODE_SHAPES = [
    ("63: a label value", 63, {}),
    ("64: no label value", 64, {}),
    ("236: the longest kept whole", 236, {}),
    ("237: cut, with a hash", 237, {}),
    ("'--' runs before the cut", 240, {20: "-----", 100: "--"}),
    ("cut on a '.'", 240, {224: "."}),
    ("cut on a '-'", 240, {224: "-"}),
    ("a run on the cut", 240, {224: "----"}),
    ("a run across the cut", 240, {222: "----"}),
]


def test_a_node_name_of_any_shape_writes_its_own_report_and_no_other(
        cluster: Cluster, release: Release, driver_on: Callable[..., Any]) -> None:
    """The policy cleans and cuts a long node name in CEL as the driver does
    in Python (capacity_report.object_name): its driver writes the report
    under its own name, with a label selector only when the name is a
    label value; a name of the cut form with another hash, or one
    character more, is refused. One apiserver, the shapes in turn."""
    ns = release.namespace
    tag = uuid.uuid4().hex[:6]
    prefix = capacity_report.object_name("x", DRIVER).removesuffix("x")
    waited = False
    for shape, length, marks in NODE_SHAPES:
        node = _node_name(tag, length, marks)
        api, pod_ = driver_on(node)
        if not waited:
            _wait_in_force(api, _report(f"gpu-{tag}", ns))
            waited = True
        name = capacity_report.object_name(node, DRIVER)
        assert (name == prefix + node) is (length <= 236), shape
        mine = _report(node, ns)
        if name != prefix + node:
            readable = name[len(prefix):-11]
            assert not readable.endswith("-") and "--" not in readable, shape
            # Not a hash; one character more (past 253 the apiserver's own
            # validation refuses it first) or less.
            for wrong in (f"{prefix}{readable}-zzzzzzzzzz", f"{name}0", name[:-1]):
                write = _create(api, {**mine, "metadata": {**mine["metadata"], "name": wrong}},
                                dry_run=True)
                if len(wrong) > 253:
                    with pytest.raises(ApiError, match="no more than 253") as invalid:
                        write()
                    assert invalid.value.status == 422, shape
                    continue
                assert "metadata.name: expected 'node-tier-" in _refusal(write), (shape, wrong)
        if length > 63:  # with a label selector after all: refused
            assert "nodeTopology: expected none" in _refusal(_create(api, {
                **mine, "nodeTopology": {"matchLabels": {"kubernetes.io/hostname":
                                                         node[:63]}}}, dry_run=True)), shape
        publisher = CapacityPublisher(api, ns, node, DRIVER, 600, owner=pod_)
        publisher(SimpleNamespace(capacity=FREE))
        assert publisher._last_error is None, (shape, publisher._last_error)
        stored = get(cluster, ns, "csistoragecapacities", name)
        assert stored["metadata"]["annotations"]["ckptdrain.io/node"] == node, shape
        assert ("nodeTopology" in stored) is (length <= 63), shape

