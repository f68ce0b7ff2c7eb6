"""Policy and pod admission keep tenants' node directories apart in hostPath
mode (policy/node_dirs.py), judged against the view of every policy or,
without one, the apiserver's list; the CSI driver's mode is left alone."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import policy_rules
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission.policy_mirror import PolicyMirror
from ckptdrain.operator.admission.rules import Refused
from ckptdrain.operator.apiserver import reads as apiserver_reads

HOSTPATH = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
CSI = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0",
                            node_tier="csi", csi_driver="node.ckptdrain.io")
#: Tenant A's policy: its node directory is /mnt/ckptdrain/nvme/team-a.
A = {"metadata": {"name": "ckpt", "namespace": "team-a", "uid": "a"},
     "spec": {"localTier": {"path": "/mnt/ckptdrain/nvme"}}}
INSIDE_A = "/mnt/ckptdrain/nvme/team-a/ckpt"


def policy(name: str, path: str, namespace: str = "team-b") -> dict[str, Any]:
    return {"apiVersion": "ckptdrain.io/v1alpha1",
            "metadata": {"name": name, "namespace": namespace, "uid": name},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "model": {"checkpointBytes": "80GB"}, "interval": "15m",
                     "localTier": {"path": path}, "storage": {"uri": "s3://bucket/runs"}}}


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The apiserver's policy lists: `policies` answered, each read recorded;
    `fail` makes a read of every namespace's fail as an unreachable
    apiserver does."""
    state: dict[str, Any] = {"policies": [], "reads": [], "fail": False}

    def list_policies(namespace: str, timeout: float = 5) -> list[dict[str, Any]]:
        state["reads"].append(namespace)
        if state["fail"] and namespace == "":
            raise OSError("connection refused")
        return list(state["policies"])

    monkeypatch.setattr(apiserver_reads, "list_policies", list_policies)
    monkeypatch.setattr(apiserver_reads, "first_injected_pod", lambda *a: None)
    return state


def admit_policy(body: dict[str, Any], every: list[dict[str, Any]] | None,
                 cfg: config.OperatorConfig = HOSTPATH,
                 old: dict[str, Any] | None = None) -> None:
    asyncio.run(policy_rules.admit_policy(body, old, body["metadata"]["namespace"], cfg,
                                          every=every))


def test_a_policy_inside_another_namespaces_directory_is_refused(
        listed: dict[str, Any]) -> None:
    with pytest.raises(Refused) as caught:
        admit_policy(policy("nest", INSIDE_A), [A])
    said = str(caught.value)
    assert caught.value.code == 403
    assert said.startswith("spec.localTier.path: ")
    assert "another namespace's node directory" in said
    assert "team-a" not in said.replace(INSIDE_A, "")  # named only as B wrote it
    assert "" not in listed["reads"]  # the view answered, not the apiserver


def test_a_policy_around_another_namespaces_directory_is_refused(
        listed: dict[str, Any]) -> None:
    # Namespace "nvme" under the root: its directory would hold A's.
    with pytest.raises(Refused):
        admit_policy(policy("wide", "/mnt/ckptdrain", namespace="nvme"), [A])


def test_siblings_and_the_same_namespace_are_admitted(listed: dict[str, Any]) -> None:
    admit_policy(policy("own", "/mnt/ckptdrain/nvme"), [A])
    admit_policy(policy("deeper", INSIDE_A, namespace="team-a"), [A])


def test_without_a_view_the_apiserver_is_asked_and_a_failed_read_refuses(
        listed: dict[str, Any]) -> None:
    listed["policies"] = [A]
    with pytest.raises(Refused):
        admit_policy(policy("nest", INSIDE_A), None)
    assert "" in listed["reads"]  # every namespace's
    listed["fail"] = True
    with pytest.raises(Refused) as caught:
        admit_policy(policy("own", "/mnt/ckptdrain/nvme"), None)
    assert caught.value.code == 503
    assert str(caught.value).startswith("spec.localTier.path: could not read")


def test_an_update_keeping_the_path_is_not_judged_again(listed: dict[str, Any]) -> None:
    # A policy admitted before the rule: it can still be changed otherwise
    # (its pods are refused until it moves).
    old = policy("nest", INSIDE_A)
    new = policy("nest", INSIDE_A)
    new["spec"]["interval"] = "20m"
    admit_policy(new, [A], old=old)
    moved = policy("nest", "/mnt/ckptdrain/nvme/team-a/other")
    with pytest.raises(Refused):
        admit_policy(moved, [A], old=old)


def test_csi_mode_keys_node_data_by_uid_and_admits_any_path(listed: dict[str, Any]) -> None:
    admit_policy(policy("nest", INSIDE_A), [A], cfg=CSI)


def admit_pod(chosen: dict[str, Any], every: list[dict[str, Any]],
              cfg: config.OperatorConfig = HOSTPATH) -> list[dict[str, Any]]:
    namespace = chosen["metadata"]["namespace"]
    pod = {"metadata": {"name": "w-0", "namespace": namespace,
                        "labels": {"app": chosen["metadata"]["name"],
                                   "ckptdrain.io/inject": "true"}},
           "spec": {"terminationGracePeriodSeconds": 3600,
                    "containers": [{"name": "trainer", "image": "t:1"}]}}
    return asyncio.run(admission.admit_pod(pod, namespace, cfg, [], logging.getLogger("t"),
                                           [chosen], lambda name: lambda rank: [],
                                           every=every))


def test_a_pod_of_a_policy_nesting_in_another_namespaces_is_refused(
        listed: dict[str, Any]) -> None:
    """A policy admitted before the rule, or beside A's on another replica."""
    nest = policy("nest", INSIDE_A)
    with pytest.raises(Refused) as caught:
        admit_pod(nest, [A, nest])
    said = str(caught.value)
    assert caught.value.code == 403
    assert "CheckpointPolicy nest spec.localTier.path" in said
    assert "another namespace's node directory" in said
    # Both tenants' pods wait: A's directory holds B's.
    a_policy = policy("ckpt", "/mnt/ckptdrain/nvme", namespace="team-a")
    with pytest.raises(Refused):
        admit_pod(a_policy, [a_policy, nest])


def test_a_pod_beside_another_namespaces_directory_is_injected(
        listed: dict[str, Any]) -> None:
    own = policy("own", "/mnt/ckptdrain/nvme")
    ops = admit_pod(own, [A, own])
    volumes = next(op["value"] for op in ops if op["path"] == "/spec/volumes")
    assert {"path": "/mnt/ckptdrain/nvme/team-b/own", "type": "DirectoryOrCreate"} in [
        v.get("hostPath") for v in volumes]


def test_a_csi_pod_is_not_judged_by_path(listed: dict[str, Any]) -> None:
    nest = policy("nest", INSIDE_A)
    ops = admit_pod(nest, [A, nest], cfg=CSI)
    assert ops
    assert listed["reads"] == []


def test_the_mirror_offers_every_namespaces_policies_only_while_current() -> None:
    mirror = PolicyMirror()
    assert mirror.every() is None  # not listed yet: admission asks the apiserver
    b = policy("own", "/mnt/ckptdrain/nvme")
    mirror.replace([A, b], "1")
    assert sorted(p["metadata"]["namespace"] for p in mirror.every() or []) == [
        "team-a", "team-b"]
    mirror.apply("DELETED", A)
    assert [p["metadata"]["name"] for p in mirror.every() or []] == ["own"]
    mirror.lost()
    assert mirror.every() is None
