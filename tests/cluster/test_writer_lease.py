"""The writer fence against a real apiserver, with exactly the agent's
documented rules (docs/rbac.md): one pod holds a writer's lease; a second
pod given the same rank is refused until the first stops renewing; without
rights on leases the fence steps aside instead of blocking commits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client, config
from test_rbac import _bind, _rules

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


def test_one_holder_per_writer_and_a_stale_holder_is_replaced(
        cluster: Cluster, namespace: str) -> None:
    kubeconfig = _bind(cluster, "Role", "ckptdrain-agent", namespace, _rules(1, dev_mode=False))
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
    records_only = [r for r in _rules(1, dev_mode=False)
                    if "coordination.k8s.io" not in r["apiGroups"]]
    kubeconfig = _bind(cluster, "Role", "no-leases", namespace, records_only)
    api = client.CustomObjectsApi(config.new_client_from_config(str(kubeconfig)))
    lease = WriterLease(namespace, "llama", 1, "uid-first", api=api)
    lease.check()
    assert lease.enabled is False
