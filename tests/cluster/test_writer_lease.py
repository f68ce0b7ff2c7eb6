"""The writer fence against a real apiserver, with exactly the agent's
documented rules (docs/rbac-agent.md): one pod holds a writer's lease; a second
pod given the same rank is refused until the first stops renewing; without
rights on leases the fence steps aside instead of blocking commits."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from documented_rbac import agent_node_lease_rules, agent_rules
from kubernetes import client, config
from test_rbac import _bind

from ckptdrain.node.kube import WriterLease
from ckptdrain.node.lease import WriterFenced
from support.apiserver import Cluster


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def monotonic(self) -> float:
        return self.now.timestamp()


def _grant_node_leases(cluster: Cluster, namespace: str) -> None:
    """The documented agent rule in kube-node-lease (docs/rbac-agent.md's
    second block), bound to the namespace's agent service account."""
    cluster.kubectl("create", "namespace", "kube-node-lease", check=False)
    cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "List", "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": f"agent-{namespace}", "namespace": "kube-node-lease"},
             "rules": agent_node_lease_rules()},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": f"agent-{namespace}", "namespace": "kube-node-lease"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                         "name": f"agent-{namespace}"},
             "subjects": [{"kind": "ServiceAccount", "name": "ckptdrain-agent",
                           "namespace": namespace}]}]}))


def test_one_holder_per_writer_and_a_stale_holder_is_replaced(
        cluster: Cluster, namespace: str) -> None:
    kubeconfig = _bind(cluster, "Role", "ckptdrain-agent", namespace, agent_rules())
    api = client.CustomObjectsApi(config.new_client_from_config(str(kubeconfig)))
    clock = Clock()
    first = WriterLease(namespace, "llama", 1, "uid-first", api=api, clock=clock,
                        monotonic=clock.monotonic)
    second = WriterLease(namespace, "llama", 1, "uid-second", api=api, clock=clock,
                        monotonic=clock.monotonic)
    other_rank = WriterLease(namespace, "llama", 0, "uid-second", api=api, clock=clock,
                        monotonic=clock.monotonic)

    first.check()
    other_rank.check()
    with pytest.raises(WriterFenced, match="held by pod uid uid-first"):
        second.check()
    clock.now += timedelta(seconds=30)
    first.check()  # renewing keeps it
    clock.now += timedelta(seconds=45)
    with pytest.raises(WriterFenced):
        second.check()  # renewed 45 s ago: still held

    # The first pod is gone (no more renewals): after the lease's duration
    # the second takes over, and the first, should it come back, is fenced.
    clock.now += timedelta(seconds=61)
    second.check()
    with pytest.raises(WriterFenced, match="uid-second"):
        first.check()
    lease = api.get_namespaced_custom_object("coordination.k8s.io", "v1", namespace,
                                             "leases", "ckptdrain-llama-w1")
    assert lease["spec"]["holderIdentity"] == "uid-second"

    # A pod that stops cleanly frees its writer at once: no minute's wait.
    second.release()
    first.check()
    second.release()  # no longer its lease: left alone
    assert api.get_namespaced_custom_object("coordination.k8s.io", "v1", namespace, "leases",
                                            "ckptdrain-llama-w1")["spec"]["holderIdentity"] \
        == "uid-first"


def test_without_rights_on_leases_fencing_steps_aside(
        cluster: Cluster, namespace: str) -> None:
    records_only = [r for r in agent_rules()
                    if "coordination.k8s.io" not in r["apiGroups"]]
    kubeconfig = _bind(cluster, "Role", "no-leases", namespace, records_only)
    api = client.CustomObjectsApi(config.new_client_from_config(str(kubeconfig)))
    lease = WriterLease(namespace, "llama", 1, "uid-first", api=api)
    lease.check()
    assert lease.enabled is False


def test_a_long_lease_fails_over_when_the_holders_node_is_gone(
        cluster: Cluster, namespace: str) -> None:
    """With the documented rules (the agent's Role and the node-lease Role in
    kube-node-lease): a writer lease that lasts 45 minutes is taken over a
    minute after its holder's node lease went, and the old holder, should it
    still run, is refused at its next commit."""
    kubeconfig = _bind(cluster, "Role", "ckptdrain-agent", namespace, agent_rules())
    _grant_node_leases(cluster, namespace)
    node, elsewhere = f"node-{namespace}", f"other-{namespace}"
    for name in (node, elsewhere):
        cluster.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40}}))
    api = client.CustomObjectsApi(config.new_client_from_config(str(kubeconfig)))
    clock = Clock()
    first = WriterLease(namespace, "llama", 3, "uid-first", api=api, seconds=2700, node=node,
                        clock=clock, monotonic=clock.monotonic)
    second = WriterLease(namespace, "llama", 3, "uid-second", api=api, seconds=2700,
                         node=elsewhere, clock=clock, monotonic=clock.monotonic)
    first.check()
    with pytest.raises(WriterFenced, match="uid-first"):
        second.check()  # the holder's node heartbeats (its lease is there)
    cluster.kubectl("delete", "lease", "-n", "kube-node-lease", node)
    with pytest.raises(WriterFenced, match="uid-first"):
        second.check()  # gone a moment ago: a node re-registering looks the same
    clock.now += timedelta(seconds=61)
    second.check()  # a minute on, with the first silent all along: taken over
    with pytest.raises(WriterFenced, match="uid-second"):
        first.check()  # its renewal is old: it renews first, and is refused
    lease = api.get_namespaced_custom_object("coordination.k8s.io", "v1", namespace,
                                             "leases", "ckptdrain-llama-w3")
    assert lease["metadata"]["annotations"]["ckptdrain.io/holder-node"] \
        == f"{elsewhere} uid-second"


class CountingApi:
    """The agent's API client, with its lease writes counted."""

    def __init__(self, api: client.CustomObjectsApi) -> None:
        self.api, self.writes = api, 0

    def __getattr__(self, name: str) -> object:
        if name.startswith(("create_", "replace_", "patch_")):
            self.writes += 1
        return getattr(self.api, name)


def test_a_commit_goes_on_two_reads_while_the_lease_and_the_node_are_as_left(
        cluster: Cluster, namespace: str) -> None:
    """A commit more than 30 s after the last renewal needs no write when the
    lease is exactly as this pod wrote it and its node's kubelet heartbeat is
    fresh; a stale heartbeat, a lease changed by anyone, or a renewal too old
    for the lease's duration each make it renew, and a lease taken by another
    pod fences it."""
    kubeconfig = _bind(cluster, "Role", "ckptdrain-agent", namespace, agent_rules())
    node = f"node-{namespace}"
    _grant_node_leases(cluster, namespace)
    clock = Clock()

    def heartbeat(age_s: float) -> None:
        at = (clock.now - timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        cluster.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": at}}))

    api = CountingApi(client.CustomObjectsApi(config.new_client_from_config(str(kubeconfig))))
    lease = WriterLease(namespace, "llama", 4, "uid-a", api=api, seconds=300, node=node,
                        clock=clock, monotonic=clock.monotonic)
    heartbeat(0)
    lease.check()
    assert api.writes == 1  # taken

    clock.now += timedelta(seconds=100)
    heartbeat(5)
    lease.check()
    assert api.writes == 1  # confirmed by reading: no write

    clock.now += timedelta(seconds=31)
    heartbeat(25)  # the kubelet is late: a taker's node test may be near
    lease.check()
    assert api.writes == 2  # renewed

    clock.now += timedelta(seconds=31)
    heartbeat(0)
    cluster.kubectl("annotate", "lease", "-n", namespace, "ckptdrain-llama-w4", "touched=1")
    lease.check()  # not as this pod left it: renewed (it is still the holder)
    assert api.writes == 4 and lease.held  # a replace refused (409), read, replaced

    clock.now += timedelta(seconds=280)  # renewal 280 s old of 300: too old to vouch
    heartbeat(0)
    lease.check()
    assert api.writes == 5

    clock.now += timedelta(seconds=31)
    heartbeat(0)
    taken = json.loads(cluster.kubectl("get", "lease", "-n", namespace, "ckptdrain-llama-w4",
                                       "-o", "json").stdout)
    taken["spec"]["holderIdentity"] = "uid-b"
    cluster.kubectl("replace", "-f", "-", input=json.dumps(taken))
    with pytest.raises(WriterFenced, match="uid-b"):
        lease.check()
