"""The policy on the CSI drivers' free-space reports in the chart: rendered
with the driver, bound to deny, matching the driver's own ServiceAccount
and every write its Role grants, and checking the report's name as the
driver makes it for the driver the chart names; not rendered without the
driver. (What it admits and refuses: tests/cluster/test_csi_capacity_policy.py.)"""

from __future__ import annotations

import io
from typing import Any

import yaml
from tests.chart.support import CHART, Tools

from ckptdrain.csi import capacity_report

#: The admission operation each write verb of RBAC reaches.
OPERATION_OF = {"create": "CREATE", "update": "UPDATE", "patch": "UPDATE",
                "delete": "DELETE", "deletecollection": "DELETE"}


def _objects(tools: Tools, *args: str, release: str = "ckptdrain",
             namespace: str = "ckptdrain") -> list[dict[str, Any]]:
    text = tools.run("helm", "template", release, str(CHART), "--namespace", namespace,
                     *args).stdout
    return [d for d in yaml.safe_load_all(io.StringIO(text)) if d]


def _policy(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"].startswith("ValidatingAdmissionPolicy")
            and o["metadata"]["name"].endswith("-csi-capacity-report")]


def _variable(policy: dict[str, Any], name: str) -> str:
    return str(next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == name))


def test_the_driver_brings_the_policy_on_its_reports(tools: Tools) -> None:
    objects = _objects(tools, "--set", "csiDriver.name=node.example.com",
                       release="tier", namespace="storage")
    [policy, binding] = sorted(_policy(objects), key=lambda o: o["kind"])
    assert binding["spec"] == {"policyName": policy["metadata"]["name"],
                               "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    [condition] = policy["spec"]["matchConditions"]
    assert condition["expression"].endswith(f"'system:serviceaccount:storage:{account}'")
    # Every write the driver's Role grants on the reports is matched.
    role = next(o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == account)
    granted = {OPERATION_OF[verb] for rule in role["rules"]
               if "csistoragecapacities" in rule["resources"]
               for verb in rule["verbs"] if verb in OPERATION_OF}
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"]) == (["storage.k8s.io"],
                                                      ["csistoragecapacities"])
    assert set(rule["operations"]) == granted == {"CREATE", "UPDATE"}
    # The name and the driver label as the driver writes them, for the chart's driver.
    name = capacity_report.object_name("gpu-7", "node.example.com")
    assert _variable(policy, "prefix") == f"'{name.removesuffix('gpu-7')}'"
    assert any("== 'node.example.com'" in v["expression"]
               for v in policy["spec"]["validations"])


def test_no_driver_no_policy(tools: Tools) -> None:
    assert _policy(_objects(tools)) != []  # the default: the CSI node tier
    assert _policy(_objects(tools, "--set", "nodeTier.mode=hostPath")) == []
