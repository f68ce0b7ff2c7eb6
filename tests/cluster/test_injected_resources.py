"""The injected containers' resources through the real webhook and apiserver:
a Guaranteed pod stays Guaranteed (the apiserver's own status.qosClass, set
when the pod is created), a policy's spec.resources reaches the injected
containers, and one above the platform's max is refused naming the field."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import jsonpatch
from cluster_helpers import INJECT, POLICIES, get, pod, policy, wait_for
from operator_process import OperatorProcess

from ckptdrain.operator import config, containers
from ckptdrain.operator.admission import injection
from ckptdrain.operator.policy import spec as policy_spec
from support.apiserver import Cluster

EQUAL = {"cpu": "2", "memory": "4Gi"}


def _sized(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return dict(wait_for(lambda: (get(cluster, namespace, POLICIES, name).get("status") or {})
                         .get("phase") and get(cluster, namespace, POLICIES, name),
                         what=f"policy {name} sized"))


def _create(cluster: Cluster, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    made = cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "json",
                           input=json.dumps(body), check=False)
    assert made.returncode == 0, made.stderr
    return dict(json.loads(made.stdout))


def _guaranteed_pod(name: str, app: str) -> dict[str, Any]:
    return pod(name, {"app": app, **INJECT}, terminationGracePeriodSeconds=600,
               containers=[{"name": "trainer", "image": "trainer:1",
                            "resources": {"requests": EQUAL, "limits": EQUAL}}])


def _ours(stored: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c["resources"] for c in stored["spec"]["initContainers"]
            if c["name"].startswith("ckptdrain-")}


def test_a_guaranteed_pod_admitted_through_the_webhook_stays_guaranteed(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("gpu"))
    stored = _sized(cluster, namespace, "gpu")
    made = _create(cluster, namespace, _guaranteed_pod("w-0", "gpu"))
    assert set(_ours(made)) == {"ckptdrain-prepare", "ckptdrain-restore", "ckptdrain-agent"}
    for got in _ours(made).values():
        assert got["limits"]["cpu"] == got["requests"]["cpu"], got
        assert got["limits"]["memory"] == got["requests"]["memory"], got
    # Computed by the apiserver from the pod as the webhook left it.
    assert made["status"]["qosClass"] == "Guaranteed"

    # The control: today's shape (qos Burstable) makes the same pod Burstable
    # on this apiserver. Patched here and created unlabelled, past the webhook.
    cfg = config.OperatorConfig(containers=dataclasses.replace(
        containers.DEFAULT_CONTAINERS, qos="Burstable"))
    p = policy_spec.parse(namespace, "gpu", stored["spec"], cfg)
    body = _guaranteed_pod("plain", "other")
    body["metadata"]["labels"] = {"app": "other"}
    patched = jsonpatch.apply_patch(copy.deepcopy(body),
                                    injection.build_pod_patch(body, p, cfg, default_rate=1e9))
    assert _create(cluster, namespace, patched)["status"]["qosClass"] == "Burstable"


def test_policy_overrides_show_in_the_injected_containers(
        cluster: Cluster, operator: OperatorProcess, namespace: str,
        apply: Callable[..., Any]) -> None:
    apply(policy("big", resources={"agent": {"requests": {"cpu": "500m", "memory": "512Mi"},
                                             "limits": {"memory": "2Gi"},
                                             "guaranteed": {"cpu": "1500m", "memory": "2Gi"}},
                                   "restore": {"requests": {"cpu": "1"}}}))
    _sized(cluster, namespace, "big")
    made = _create(cluster, namespace, pod("w-0", {"app": "big", **INJECT},
                                           terminationGracePeriodSeconds=600))
    got = _ours(made)
    assert got["ckptdrain-agent"] == {"requests": {"cpu": "500m", "memory": "512Mi"},
                                      "limits": {"memory": "2Gi"}}
    assert got["ckptdrain-restore"]["requests"] == {"cpu": "1", "memory": "256Mi"}
    assert made["status"]["qosClass"] == "Burstable"

    # In a Guaranteed pod the `guaranteed` amounts, as requests and limits.
    made = _create(cluster, namespace, _guaranteed_pod("w-1", "big"))
    assert _ours(made)["ckptdrain-agent"] == {
        "requests": {"cpu": "1500m", "memory": "2Gi"},
        "limits": {"cpu": "1500m", "memory": "2Gi"}}
    assert _ours(made)["ckptdrain-restore"] == {
        "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    assert made["status"]["qosClass"] == "Guaranteed"


def test_an_override_above_the_platform_max_is_refused_naming_the_field(
        operator: OperatorProcess, apply: Callable[..., Any]) -> None:
    result = apply(policy("greedy", resources={"agent": {"requests": {"cpu": "3"}}}),
                   check=False)
    assert result.returncode != 0
    assert "spec.resources.agent.requests.cpu: expected at most 2" in result.stderr


def test_an_ephemeral_storage_limit_is_refused_saying_why(
        operator: OperatorProcess, apply: Callable[..., Any]) -> None:
    result = apply(policy("disk", resources={"agent": {"limits": {"ephemeral-storage": "1Gi"}}}),
                   check=False)
    assert result.returncode != 0
    assert "ephemeral-storage" in result.stderr, result.stderr


def test_a_misspelt_resource_name_is_refused_by_the_crd(
        cluster: Cluster, crds: None, namespace: str) -> None:
    """Not pruned in silence: kubectl's strict field validation names it."""
    body = policy("typo", resources={"agent": {"requests": {"cpus": "1"}}})
    body["metadata"]["namespace"] = namespace
    result = cluster.kubectl("create", "-f", "-", input=json.dumps(body), check=False)
    assert result.returncode != 0 and "cpus" in result.stderr, result.stderr
