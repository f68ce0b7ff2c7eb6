"""agent.identities reaches the operator as the mapping its config reads;
values the operator would refuse at start are refused by the chart's
schema instead (a crash loop otherwise); and in a mapped namespace the
agent's ServiceAccount drops EKS's annotations, so that EKS's webhook does
not hand the shared role to the trainer."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.chart.support import CHART, Tools

from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config
from ckptdrain.operator.tenant_identities import WebIdentity

ROLE_A = "arn:aws:iam::111122223333:role/ckpt-team-a"
ROLE_B = "arn:aws-cn:iam::444455556666:role/tenants/ckpt-team-b"
SHARED = "arn:aws:iam::111122223333:role/ckptdrain-agent"


def _render(tools: Tools, tmp_path: Path, values: dict[str, Any],
            check: bool = True) -> Any:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return tools.run("helm", "template", "ckptdrain", str(CHART), "-f", str(path), check=check)


def _objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(io.StringIO(text)) if d]


def _operator_env(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = next(d for d in objects if d["kind"] == "Deployment")
    return {e["name"]: e.get("value")
            for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_the_identities_reach_the_operator(tools: Tools, tmp_path: Path) -> None:
    def read(values: dict[str, Any]) -> Any:
        env = _operator_env(_objects(_render(tools, tmp_path, values).stdout))
        return config.from_env({"CKPTDRAIN_AGENT_IDENTITIES":
                                env["CKPTDRAIN_AGENT_IDENTITIES"]}).identities

    assert read({}) == ()
    # Numbers from a values file are floats to Helm: they must still render
    # as the whole numbers the operator takes.
    assert read({"agent": {"identities": {
        "team-a": {"awsRoleArn": ROLE_A},
        "team-b": {"awsRoleArn": ROLE_B, "audience": "ckptdrain.io/store",
                   "expirationSeconds": 7200}}}}) == (
        ("team-a", WebIdentity(ROLE_A)),
        ("team-b", WebIdentity(ROLE_B, "ckptdrain.io/store", 7200)))


@pytest.mark.parametrize("identities", [
    {"Team_A": {"awsRoleArn": ROLE_A}},                                   # no namespace
    {"team-a": {}},                                                       # no role
    {"team-a": {"awsRoleArn": "arn:aws:iam::1111:role/x"}},               # short account
    {"team-a": {"awsRoleArn": "arn:aws:iam::111122223333:user/x"}},       # not a role
    {"team-a": {"awsRoleArn": ROLE_A, "expirationSeconds": 599}},
    {"team-a": {"awsRoleArn": ROLE_A, "expirationSeconds": "3600"}},
    {"team-a": {"awsRoleArn": ROLE_A, "audience": "two words"}},
    {"team-a": {"awsRoleArn": ROLE_A, "roleArn": ROLE_A}},                # misspelt key
    {"team-a": ROLE_A},
])
def test_what_the_operator_refuses_the_chart_refuses(tools: Tools, tmp_path: Path,
                                                     identities: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):  # the operator would exit at start
        config.from_env({"CKPTDRAIN_AGENT_IDENTITIES": json.dumps(identities)})
    result = _render(tools, tmp_path, {"agent": {"identities": identities}}, check=False)
    assert result.returncode != 0 and "identities" in result.stderr, result.stderr


def test_a_mapped_namespaces_service_account_drops_eks_annotations(
        tools: Tools, tmp_path: Path) -> None:
    objects = _objects(_render(tools, tmp_path, {"agent": {
        "namespaces": ["team-a", "shared"],
        "serviceAccount": {"annotations": {
            "eks.amazonaws.com/role-arn": SHARED,
            "eks.amazonaws.com/sts-regional-endpoints": "true",
            "example.com/owner": "ml-platform"}},
        "identities": {"team-a": {"awsRoleArn": ROLE_A}}}}).stdout)
    accounts = {o["metadata"]["namespace"]: o["metadata"].get("annotations")
                for o in objects if o["kind"] == "ServiceAccount"
                and o["metadata"]["name"] == "ckptdrain-agent"}
    assert accounts == {
        "team-a": {"example.com/owner": "ml-platform"},
        "shared": {"eks.amazonaws.com/role-arn": SHARED,
                   "eks.amazonaws.com/sts-regional-endpoints": "true",
                   "example.com/owner": "ml-platform"}}


def test_a_namespace_listed_twice_is_refused(tools: Tools, tmp_path: Path) -> None:
    """Listed twice, a namespace would get its ServiceAccount and RoleBindings
    rendered twice (duplicate objects in one release): the schema says
    which entries repeat instead."""
    result = _render(tools, tmp_path, {"agent": {"namespaces": ["team-a", "team-b", "team-a"]}},
                     check=False)
    assert result.returncode != 0, result.stdout
    assert "/agent/namespaces" in result.stderr and "equal" in result.stderr, result.stderr
    _render(tools, tmp_path, {"agent": {"namespaces": ["team-a", "team-b"]}})
