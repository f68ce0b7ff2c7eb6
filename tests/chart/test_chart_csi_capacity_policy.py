"""The policy on the CSI drivers' free-space reports in the chart: rendered
with the driver, bound to deny, matching the driver's own ServiceAccount
and every write its Role grants, and checking the report's name as the
driver makes it for the driver the chart names, by the driver's own
constants; not rendered without the driver, nor with
csiDriver.restrictCapacityReports false. (What it admits and refuses:
tests/cluster/test_csi_capacity_policy.py.)"""

from __future__ import annotations

import io
from typing import Any

import pytest
import yaml
from tests.chart.support import CHART, Tools

from ckptdrain.contract.csi import (
    CAPACITY_ANNOTATION_NODE,
    CAPACITY_LABEL_DRIVER,
    CAPACITY_STORAGE_CLASS,
    DEFAULT_DRIVER_NAME,
)
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


def test_the_policy_checks_what_the_driver_writes_by_its_own_constants(tools: Tools) -> None:
    """The template spells the driver's constants (capacity_report.py,
    contract/csi.py) in CEL: a change on either side fails here."""
    [policy] = [o for o in _policy(_objects(tools)) if o["kind"] == "ValidatingAdmissionPolicy"]
    prefix = capacity_report.object_name("x", DEFAULT_DRIVER_NAME).removesuffix("x")
    room = capacity_report.MAX_NAME - len(prefix) - 1 - capacity_report.HASH_CHARS
    assert f"substring(0, {room})" in _variable(policy, "cut")
    assert f"<= {capacity_report.MAX_NAME}" in _variable(policy, "nameFits")
    assert f"<= {capacity_report.MAX_LABEL_VALUE}" in _variable(policy, "topologyFits")
    assert f"[?'{CAPACITY_ANNOTATION_NODE}']" in _variable(policy, "reportedNode")
    assert f"[?'{CAPACITY_LABEL_DRIVER}']" in _variable(policy, "driverLabel")
    rules = [v["expression"] for v in policy["spec"]["validations"]]
    hashed = next(r for r in rules if "variables.expectedName" in r)
    hash_chars = capacity_report.HASH_CHARS
    assert f"+ {hash_chars + 1} &&" in hashed and f"- {hash_chars})" in hashed
    assert f"matches('^[0-9a-f]{{{hash_chars}}}$')" in hashed
    assert f"object.storageClassName == '{CAPACITY_STORAGE_CLASS}'" in rules
    topology = next(r for r in rules if "nodeTopology" in r)
    assert f"{{'{capacity_report.HOSTNAME_LABEL}': variables.node}}" in topology


# No --api-versions: the policy follows its values alone, as `helm template`
# renders it for Argo CD and Flux.
@pytest.mark.parametrize(("args", "present"), [
    ([], True),                                                    # the default
    (["--set", "csiDriver.restrictCapacityReports=true"], True),
    (["--set", "csiDriver.restrictCapacityReports=false"], False),
    (["--set", "nodeTier.mode=hostPath"], False),                  # no driver
    (["--set", "nodeTier.mode=hostPath",
      "--set", "csiDriver.restrictCapacityReports=true"], False),
])
def test_the_policy_follows_the_driver_and_its_value(tools: Tools, args: list[str],
                                                     present: bool) -> None:
    kinds = sorted(o["kind"] for o in _policy(_objects(tools, *args)))
    assert kinds == (["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
                     if present else [])


def test_a_wrong_restrict_capacity_reports_value_is_refused(tools: Tools) -> None:
    result = tools.run("helm", "template", "ckptdrain", str(CHART), "--set",
                       "csiDriver.restrictCapacityReports=maybe", check=False)
    assert result.returncode != 0
    assert "/csiDriver/restrictCapacityReports" in result.stderr, result.stderr
    assert "want boolean" in result.stderr, result.stderr
