"""Checkpoint recency in the chart: operator.publishRecency (default on)
brings the patch rights on workloads, the policy that narrows them to one
annotation, and the operator's switch; off, none of the three."""

from __future__ import annotations

import io
from typing import Any

import yaml
from tests.chart.support import CHART, Tools

#: (group, resource) the operator writes the annotation on.
WORKLOADS = {("batch", "jobs"), ("jobset.x-k8s.io", "jobsets"),
             ("kubeflow.org", "pytorchjobs"), ("leaderworkerset.x-k8s.io", "leaderworkersets"),
             ("trainer.kubeflow.org", "trainjobs"), ("kueue.x-k8s.io", "workloads")}


def _objects(tools: Tools, *args: str) -> list[dict[str, Any]]:
    text = tools.run("helm", "template", "ckptdrain", str(CHART), "--namespace", "ckptdrain",
                     *args).stdout
    return [d for d in yaml.safe_load_all(io.StringIO(text)) if d]


def _patched(objects: list[dict[str, Any]]) -> set[tuple[str, str]]:
    role = next(o for o in objects if o["kind"] == "ClusterRole"
                and o["metadata"]["name"] == "ckptdrain")
    return {(g, r) for rule in role["rules"] if "patch" in rule["verbs"]
            for g in rule["apiGroups"] for r in rule["resources"]}


def _env(objects: list[dict[str, Any]]) -> str:
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    return str(next(e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]
                    ["env"] if e["name"] == "CKPTDRAIN_PUBLISH_RECENCY"))


def test_publishing_is_on_by_default_and_every_write_it_grants_is_narrowed(
        tools: Tools) -> None:
    from ckptdrain.operator import config

    objects = _objects(tools)
    assert _patched(objects) >= WORKLOADS
    vap = next(o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"
               and o["metadata"]["name"] == "ckptdrain-recency-writes")
    narrowed = {(g, r) for rule in vap["spec"]["matchConstraints"]["resourceRules"]
                for g in rule["apiGroups"] for r in rule["resources"]}
    assert narrowed == WORKLOADS  # every kind granted patch for this, and no other
    assert all(rule["operations"] == ["UPDATE"]
               for rule in vap["spec"]["matchConstraints"]["resourceRules"])
    assert "system:serviceaccount:ckptdrain:ckptdrain'" in \
        vap["spec"]["matchConditions"][0]["expression"]
    binding = next(o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"
                   and o["spec"]["policyName"] == "ckptdrain-recency-writes")
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert config.from_env({"CKPTDRAIN_PUBLISH_RECENCY": _env(objects)}).publish_recency


def test_publishing_off_grants_nothing_and_tells_the_operator(tools: Tools) -> None:
    from ckptdrain.operator import config

    objects = _objects(tools, "--set", "operator.publishRecency=false")
    assert _patched(objects) & WORKLOADS == set()
    assert not [o for o in objects if o["metadata"]["name"] == "ckptdrain-recency-writes"]
    assert not config.from_env({"CKPTDRAIN_PUBLISH_RECENCY": _env(objects)}).publish_recency
