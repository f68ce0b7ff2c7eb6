"""The chart's high-availability shape, as rendered: replicas, rolling
updates, the PodDisruptionBudget, the topology spread, the priority class,
the pod webhook's failure policy, and the env that lets each replica find
itself in the peering object. (test_chart.py installs the defaults into a
real API server.)"""

from __future__ import annotations

import io

import pytest
import yaml
from tests.chart.support import CHART, Tools

pytestmark = pytest.mark.cluster


def _objects(tools: Tools, *args: str) -> list[dict]:
    out = tools.run("helm", "template", "ckptdrain", str(CHART), "--namespace", "ckptdrain",
                    *args).stdout
    return [d for d in yaml.safe_load_all(io.StringIO(out)) if d]


def _one(objects: list[dict], kind: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def test_defaults_are_highly_available(tools: Tools) -> None:
    objects = _objects(tools)
    deployment = _one(objects, "Deployment")
    spec, pod = deployment["spec"], deployment["spec"]["template"]["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate",
                                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    selector = spec["selector"]["matchLabels"]

    pdb = _one(objects, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": selector}}

    spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
    assert set(spread) == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    for c in spread.values():
        assert c["labelSelector"]["matchLabels"] == selector
        assert (c["maxSkew"], c["whenUnsatisfiable"]) == (1, "ScheduleAnyway")

    priority = _one(objects, "PriorityClass")
    assert pod["priorityClassName"] == priority["metadata"]["name"]
    assert 0 < priority["value"] < 2_000_000_000 and priority["globalDefault"] is False

    hooks = _one(objects, "MutatingWebhookConfiguration")["webhooks"]
    assert [(h["name"], h["failurePolicy"]) for h in hooks] == [
        ("pods.mutate.ckptdrain.io", "Fail"), ("checkpointpolicies.mutate.ckptdrain.io", "Fail")]
    # A policy created without a class is bound to the default class, on CREATE only.
    assert hooks[1]["clientConfig"]["service"]["path"] == "/ckptdrain-policy-class"
    assert hooks[1]["rules"][0]["operations"] == ["CREATE"]
    assert hooks[0]["objectSelector"] == {"matchLabels": {"ckptdrain.io/inject": "true"}}
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert _one(objects, "ClusterKopfPeering")["metadata"]["name"] == \
        env["CKPTDRAIN_PEERING"]["value"]
    # Requests fit what the operator uses; a memory limit bounds a leak.
    resources = pod["containers"][0]["resources"]
    assert resources["requests"]["memory"] == "192Mi" and resources["limits"]["memory"]


def test_one_replica_has_no_budget_and_ignore_is_a_choice(tools: Tools) -> None:
    objects = _objects(tools, "--set", "operator.replicas=1",
                       "--set", "webhook.podFailurePolicy=Ignore",
                       "--set", "operator.priorityClassName=system-cluster-critical")
    assert not [o for o in objects if o["kind"] in ("PodDisruptionBudget", "PriorityClass")]
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    hooks = _one(objects, "MutatingWebhookConfiguration")["webhooks"]
    assert hooks[0]["failurePolicy"] == "Ignore"
    assert hooks[1]["failurePolicy"] == "Fail"  # the policies' binding always fails closed


def test_no_priority_class_and_no_spread_when_turned_off(tools: Tools) -> None:
    objects = _objects(tools, "--set", "priorityClass.create=false",
                       "--set", "operator.topologySpread.enabled=false")
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    assert "priorityClassName" not in pod and "topologySpreadConstraints" not in pod


def test_several_replicas_without_peering_are_refused(tools: Tools) -> None:
    result = tools.run("helm", "template", "ckptdrain", str(CHART),
                       "--set", "operator.peering=false", check=False)
    assert result.returncode != 0
    assert "operator.peering must be true with more than one replica" in result.stderr
    _objects(tools, "--set", "operator.peering=false", "--set", "operator.replicas=1")


def test_the_scale_harness_runs_the_operator_with_the_deployed_allocator(tools: Tools) -> None:
    """docs/scale.md's memory figures are the deployed operator's only if the
    harness sets the allocator the Deployment sets."""
    from benchmarks.scale.cluster import DEPLOYED_MALLOC

    deployment = _one(_objects(tools), "Deployment")
    env = {e["name"]: e.get("value")
           for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PYTHONMALLOC"] == DEPLOYED_MALLOC == "malloc"
