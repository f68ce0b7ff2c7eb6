"""docs/rbac.md and the chart grant the operator the same rights: the cluster
test (tests/cluster/test_rbac.py) runs the operator with the documented rules,
so a right only the chart grants would go untested and undocumented."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
import yaml
from tests.chart.support import CHART, REPO, Tools, documents, render

Grant = tuple[str, str, str, str]  # apiGroup, resource, resourceName ("" = any), verb


def _grants(rules: list[dict[str, Any]]) -> set[Grant]:
    """Each rule spread into single grants, so that how rules are split or
    merged does not matter, only what they allow."""
    return {(group, resource, name, verb) for r in rules for group in r["apiGroups"]
            for resource in r["resources"] for name in r.get("resourceNames") or [""]
            for verb in r["verbs"]}


def _documented() -> set[Grant]:
    """The operator's rules as docs/rbac.md writes them (its first block;
    the development-mode rule stays commented out, as the chart's default)."""
    text = (REPO / "docs" / "rbac.md").read_text()
    block = re.findall(r"```yaml\n(.*?)```", text, re.S)[0]
    return _grants(yaml.safe_load(block)["rules"])


def _rendered(tools: Tools, *args: str) -> set[Grant]:
    """The operator's rules as the chart renders them: its namespaced rules
    (`ckptdrain`, a ClusterRole or, with a watched namespace, a Role) and its
    cluster-scoped ones (`ckptdrain-cluster`), with the peer tier on: the doc
    lists its rules, saying they come only with operator.peerTier. The
    webhook certificate's and the peer CAs' Roles have sections of their own."""
    text = tools.run("helm", "template", "ckptdrain", str(CHART), "--namespace", "ckptdrain",
                     "--set", "operator.peerTier=true", *args).stdout
    roles = [d for d in yaml.safe_load_all(io.StringIO(text)) if d
             and d["kind"] in ("Role", "ClusterRole")
             and d["metadata"]["name"] in ("ckptdrain", "ckptdrain-cluster")]
    assert len(roles) == 2, [r["metadata"]["name"] for r in roles]
    return _grants([rule for role in roles for rule in role["rules"]])


def test_the_documented_operator_rules_are_the_charts(tools: Tools) -> None:
    """The doc covers both installs: cluster-wide (ClusterKopfPeering) and one
    watched namespace (KopfPeering)."""
    documented = _documented()
    watched = _rendered(tools, "--set", "operator.watchNamespace=ml-a")
    # One watched namespace: the namespaces' labels of that one only, as
    # the doc's comment on the rule says (the block shows the cluster-wide
    # install's rule).
    labels = {g for g in watched if g[1] == "namespaces"}
    assert labels == {("", "namespaces", "ml-a", "get")}
    text = (REPO / "docs" / "rbac.md").read_text()
    assert "operator.watchNamespace set, the chart adds resourceNames" in text
    rendered = _rendered(tools) | (watched - labels)
    assert rendered - documented == set(), "granted by the chart, missing from docs/rbac.md"
    assert documented - rendered == set(), "documented, not granted by the chart"


def _operator_env(objects: list[dict[str, Any]], name: str) -> str:
    """The value of the operator container's environment variable `name`."""
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    return next(e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]
                ["env"] if e["name"] == name)


def _section(heading: str) -> set[Grant]:
    text = (REPO / "docs" / "rbac.md").read_text()
    block = re.findall(r"```yaml\n(.*?)```", text[text.index(heading):], re.S)[0]
    return _grants(yaml.safe_load(block)["rules"])


def test_the_record_of_agent_images_follows_its_value(tools: Tools) -> None:
    """With agent.pinImages (the default): the ConfigMap rendered without
    data (an upgrade never resets what the operator wrote), a Role reading
    and updating it by name exactly as docs/rbac.md says, and its
    "namespace/name" passed to the operator; without it, none of these."""
    from ckptdrain.operator import config

    def rendered(*args: str) -> list[dict[str, Any]]:
        return documents(render(tools, *args).stdout)

    def env(objects: list[dict[str, Any]]) -> str:
        return _operator_env(objects, "CKPTDRAIN_AGENT_IMAGES")

    objects = rendered()
    named = [o for o in objects if o["metadata"]["name"] == "ckptdrain-agent-images"]
    assert sorted(o["kind"] for o in named) == ["ConfigMap", "Role", "RoleBinding"]
    record = next(o for o in named if o["kind"] == "ConfigMap")
    assert "data" not in record and record["metadata"]["namespace"] == "ckptdrain"
    role = next(o for o in named if o["kind"] == "Role")
    assert _grants(role["rules"]) == _section("## The record of agent images")
    assert config.from_env({"CKPTDRAIN_AGENT_IMAGES": env(objects)}).agent_images \
        == "ckptdrain/ckptdrain-agent-images"
    off = rendered("--set", "agent.pinImages=false")
    assert not [o for o in off if o["metadata"]["name"] == "ckptdrain-agent-images"]
    assert config.from_env({"CKPTDRAIN_AGENT_IMAGES": env(off)}).agent_images == ""


# -- the peer tier's Secrets and ConfigMaps: bound where its policies can be ----------

PEER_TIER = "ckptdrain-peer-tier"


def _objects(tools: Tools, *args: str) -> list[dict[str, Any]]:
    return documents(render(tools, "--set", "operator.peerTier=true", *args).stdout)


def _reach(objects: list[dict[str, Any]], resource: str) -> set[str]:
    """Where the operator's roles grant anything on `resource` in a policy's
    namespace without naming the object: "*" for every namespace (a
    ClusterRole under a ClusterRoleBinding), else the namespaces (the CA
    namespace's own Role aside)."""
    def grants(role: dict[str, Any]) -> bool:
        return any(resource in r["resources"] and not r.get("resourceNames")
                   for r in role.get("rules") or [])
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objects if o["kind"] in ("Role", "ClusterRole")}
    where: set[str] = set()
    for b in (o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if not any(s["name"] == "ckptdrain" for s in b["subjects"]):
            continue
        ref = b["roleRef"]
        namespace = b["metadata"].get("namespace")
        role = roles[(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])]
        if grants(role) and namespace != "ckptdrain-peer-ca":
            where.add(namespace or "*")
    return where


@pytest.mark.parametrize(("args", "reach"), [
    ([], {"*"}),                                                  # all namespaces
    (["--set", "agent.namespaces={ml-a,ml-b}"], {"ml-a", "ml-b"}),  # the multi-tenant install
    (["--set", "operator.watchNamespace=ml-w"], {"ml-w"}),
    (["--set", "operator.watchNamespace=ml-w", "--set", "agent.namespaces={ml-a}"], {"ml-w"}),
    # Training namespaces whose pods bring their own ServiceAccount.
    (["--set", "agent.namespaces={ml-a}", "--set", "operator.peerTierNamespaces={ml-x,ml-a}"],
     {"ml-a", "ml-x"}),
    (["--set", "operator.peerTierNamespaces={ml-x}"], {"*"}),  # nothing narrows: all
    (["--set", "operator.watchNamespace=ml-w", "--set", "agent.namespaces={ml-a}",
      "--set", "operator.peerTierNamespaces={ml-x}"], {"ml-w"}),
])
def test_the_peer_tiers_secrets_and_configmaps_reach_only_its_namespaces(
        tools: Tools, args: list[str], reach: set[str]) -> None:
    objects = _objects(tools, *args)
    assert _reach(objects, "secrets") == _reach(objects, "configmaps") == reach
    role = next(o for o in objects if o["metadata"]["name"] == PEER_TIER
                and o["kind"] == "ClusterRole")
    assert _grants(role["rules"]) == _section("## The peer tier's Secrets and ConfigMaps")
    # The CA namespace keeps its own Role whatever the mode.
    assert [o["metadata"]["namespace"] for o in objects if o["kind"] == "Role"
            and o["metadata"]["name"] == "ckptdrain-peer-ca"] == ["ckptdrain-peer-ca"]
    off = tools.run("helm", "template", "ckptdrain", str(CHART), "--namespace", "ckptdrain",
                    *args).stdout
    assert PEER_TIER not in off


def _write_policy(objects: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"
                 and o["metadata"]["name"] == "ckptdrain-operator-writes"), None)


@pytest.mark.parametrize(("args", "present"), [
    ([], True),
    (["--set", "operator.restrictSecretUpdates=auto"], True),
    (["--set", "operator.restrictSecretUpdates=false"], False),
])
def test_the_operators_write_policy_follows_the_secret_policys_values(
        tools: Tools, args: list[str], present: bool) -> None:
    objects = _objects(tools, *args)
    policy = _write_policy(objects)
    assert (policy is not None) is present
    bindings = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"
                and o["spec"]["policyName"] == "ckptdrain-operator-writes"]
    assert len(bindings) == int(present)
    if policy is None:
        return
    assert bindings[0]["spec"]["validationActions"] == ["Deny"]
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    # Creates of Secrets, creates and changes of ConfigMaps: nothing else.
    assert sorted((r["resources"][0], op) for r in spec["matchConstraints"]["resourceRules"]
                  for op in r["operations"]) == [
        ("configmaps", "CREATE"), ("configmaps", "UPDATE"), ("secrets", "CREATE")]
    # The operator's ServiceAccount alone, and the names this release uses.
    [match] = spec["matchConditions"]
    assert "'system:serviceaccount:ckptdrain:ckptdrain'" in match["expression"]
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "'ckptdrain-peer-ca'" in variables["caSecret"]
    assert "'ckptdrain-webhook-cert'" in variables["webhookSecret"]
    assert "'ckptdrain-agent-images'" in variables["agentImages"]
    assert "'ckptdrain'" in variables["ownNamespace"]
    without = tools.run("helm", "template", "ckptdrain", str(CHART), "--namespace",
                        "ckptdrain").stdout
    assert "ckptdrain-operator-writes" not in without, "rendered without the peer tier"


# -- Kueue's configuration: read by name, only when the chart is told where -----------

def test_kueues_configmap_is_read_by_name_only_where_set(tools: Tools) -> None:
    """kueue.configMap set: a Role in Kueue's namespace granting get on that
    one ConfigMap, as docs/rbac.md says (its name aside), bound to the
    operator's account, and "namespace/name" passed to the operator; unset
    (the default) or half set: none of these."""
    from ckptdrain.operator import config

    def rendered(*args: str) -> list[dict[str, Any]]:
        return documents(render(tools, *args).stdout)

    def env(objects: list[dict[str, Any]]) -> str:
        return _operator_env(objects, "CKPTDRAIN_KUEUE_CONFIGMAP")

    objects = rendered("--set", "kueue.configMap.namespace=kq",
                       "--set", "kueue.configMap.name=kq-manager-config")
    named = [o for o in objects if o["metadata"]["name"] == "ckptdrain-kueue-config"]
    assert sorted(o["kind"] for o in named) == ["Role", "RoleBinding"]
    assert all(o["metadata"]["namespace"] == "kq" for o in named)
    role = next(o for o in named if o["kind"] == "Role")
    documented = {(g, r, "kq-manager-config" if n == "kueue-manager-config" else n, v)
                  for g, r, n, v in _section("## Kueue's configuration")}
    assert _grants(role["rules"]) == documented
    binding = next(o for o in named if o["kind"] == "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ckptdrain",
                                    "namespace": "ckptdrain"}]
    assert config.from_env({"CKPTDRAIN_KUEUE_CONFIGMAP": env(objects)}).kueue_config \
        == "kq/kq-manager-config"
    for args in ((), ("--set", "kueue.configMap.namespace=kq")):
        off = rendered(*args)
        assert not [o for o in off if o["metadata"]["name"] == "ckptdrain-kueue-config"]
        assert env(off) == ""
