"""The CheckpointPolicy CRD's own rules (x-kubernetes-validations and schema
minimums) against a real apiserver, no operator needed: what one object can
say wrong is refused by the apiserver's own validation, before any webhook
and naming the field, so a bad policy stays out while the operator's webhook
is down. Each rule has one
accepted and one refused object; the operator's own parser judges both the
same way (the CRD is never stricter than the operator), and every policy we
ship is accepted, in the version it is written in (v1beta1 ones converted
through the admission process's /convert, as on an installed operator)."""

from __future__ import annotations

import copy
import json
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from cluster_helpers import policy
from operator_process import repo_root

from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import spec as operator_policy
from support import apiserver
from support.apiserver import Cluster
from support.conversion_server import converting_crds

CRD = repo_root() / "crds" / "checkpointpolicies.yaml"
LONG_NAME = "a" * 64
Change = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Change:
    """A change setting spec.<path> (dots) to `value`; None removes it."""
    def change(body: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = body["spec"]
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = copy.deepcopy(value)
    return change


def _both(*changes: Change) -> Change:
    def change(body: dict[str, Any]) -> None:
        for c in changes:
            c(body)
    return change


def _name(name: str) -> Change:
    def change(body: dict[str, Any]) -> None:
        body["metadata"]["name"] = name
    return change


@dataclass(frozen=True)
class Rule:
    label: str
    accepted: Change
    refused: Change
    #: What the refusal names: the field, and what was expected.
    names: tuple[str, ...]


def _expr(op: str, values: list[str] | None, key: str = "team") -> dict[str, Any]:
    expr: dict[str, Any] = {"key": key, "operator": op}
    if values is not None:
        expr["values"] = values
    return expr


def _node(*exprs: dict[str, Any]) -> Change:
    return _set("placement", {"nodeAffinity": {"matchExpressions": list(exprs)}})


#: The longest qualified name: a 253-character DNS subdomain, '/', 63 characters.
QUALIFIED = "a" * 253 + "/" + "n" * 63


GS = {"uri": "gs://ckpt-bucket/runs"}
S3 = {"uri": "s3://ckpt-bucket/runs", "endpoint": "http://minio.storage:9000",
      "credentialsSecretRef": {"name": "s3-creds"}}
PEER = {"enabled": True}

RULES = [
    Rule("interval or mtti", _both(_set("interval", None), _set("mtti", "150m")),
         _set("interval", None), ("spec.interval", "mtti")),
    Rule("model size", _set("model", {"checkpointBytes": "5.67TB"}),
         _set("model", {"bytesPerParameter": 14}), ("spec.model", "checkpointBytes")),
    Rule("parameters positive", _set("model", {"parameters": "0.5B"}),
         _set("model", {"parameters": "0.0B"}), ("spec.model.parameters", "positive")),
    Rule("checkpointBytes positive", _set("model", {"checkpointBytes": "0.5TB"}),
         _set("model", {"checkpointBytes": "0TB"}), ("spec.model.checkpointBytes", "positive")),
    Rule("one rank field", _set("identity", {"rankAnnotation": "example.com/rank"}),
         _set("identity", {"rankLabel": "example.com/rank", "rankAnnotation": "rank"}),
         ("spec.identity", "exactly one of rankLabel or rankAnnotation")),
    Rule("rank label key", _set("identity", {"rankLabel": "example.com/Rank_1"}),
         _set("identity", {"rankLabel": "example.com/rank/x"}),
         ("spec.identity.rankLabel", "label key")),
    Rule("rank annotation key", _set("identity", {"rankAnnotation": "rank"}),
         _set("identity", {"rankAnnotation": "-rank"}),
         ("spec.identity.rankAnnotation", "annotation key")),
    Rule("rank key prefix a DNS subdomain", _set("identity", {"rankLabel": QUALIFIED}),
         _set("identity", {"rankLabel": "a..b/rank"}), ("spec.identity.rankLabel", "label key")),
    Rule("rank key prefix of at most 253",
         _set("identity", {"rankAnnotation": "a.b-c/rank"}),
         _set("identity", {"rankAnnotation": "a" * 254 + "/rank"}),
         ("spec.identity.rankAnnotation", "annotation key")),
    Rule("overlap at most 100%", _set("overlap", "100%"), _set("overlap", "100.5%"),
         ("spec.overlap", "(0, 1]")),
    Rule("overlap above 0%", _set("overlap", "0.01%"), _set("overlap", "0%"),
         ("spec.overlap", "(0, 1]")),
    Rule("overlap fraction", _set("overlap", "1."), _set("overlap", "1.01"),
         ("spec.overlap", "(0, 1]")),
    Rule("overlap fraction above 0", _set("overlap", ".5"), _set("overlap", ".0"),
         ("spec.overlap", "(0, 1]")),
    Rule("no '..' in the local path", _set("localTier.path", "/mnt/ckptdrain/a..b"),
         _set("localTier.path", "/mnt/ckptdrain/../ckptdrain/x"),
         ("spec.localTier.path", "'..'")),
    Rule("selector In has values", _set("selector.matchExpressions", [_expr("In", ["a"])]),
         _set("selector.matchExpressions", [_expr("NotIn", [])]),
         ("spec.selector.matchExpressions[0].values", "at least one value")),
    Rule("selector Exists has none",
         _set("selector.matchExpressions", [_expr("DoesNotExist", [])]),
         _set("selector.matchExpressions", [_expr("Exists", ["a"])]),
         ("spec.selector.matchExpressions[0].values", "no values")),
    Rule("node In has values",
         _set("placement", {"nodeAffinity": {"matchExpressions": [_expr("In", ["a"])]}}),
         _set("placement", {"nodeAffinity": {"matchExpressions": [_expr("In", None)]}}),
         ("spec.placement.nodeAffinity.matchExpressions[0].values", "at least one value")),
    Rule("node Exists has none",
         _set("placement", {"nodeAffinity": {"matchExpressions": [_expr("Exists", None)]}}),
         _set("placement", {"nodeAffinity": {"matchExpressions": [_expr("Exists", ["a"])]}}),
         ("spec.placement.nodeAffinity.matchExpressions[0].values", "no values")),
    Rule("node Gt one number", _node(_expr("Gt", ["3"])), _node(_expr("Lt", ["3", "4"])),
         ("spec.placement.nodeAffinity.matchExpressions[0].values", "one whole number")),
    # A pod's Gt/Lt value is a label value: no sign.
    Rule("node Gt not negative", _node(_expr("Gt", ["0"])), _node(_expr("Gt", ["-3"])),
         ("spec.placement.nodeAffinity.matchExpressions[0].values", "whole number")),
    Rule("node Gt an int64", _node(_expr("Lt", ["9" * 18])), _node(_expr("Lt", ["1" * 19])),
         ("spec.placement.nodeAffinity.matchExpressions[0].values", "at most 18 digits")),
    Rule("node key a qualified name", _node(_expr("Exists", None, QUALIFIED)),
         _node(_expr("Exists", None, "a..b/rank")),
         ("spec.placement.nodeAffinity.matchExpressions[0].key", "node label key")),
    Rule("node key prefix a DNS subdomain", _node(_expr("Exists", None, "a.b-c/x")),
         _node(_expr("Exists", None, "a-.b/x")),
         ("spec.placement.nodeAffinity.matchExpressions[0].key", "node label key")),
    Rule("node value a label value", _node(_expr("In", ["v" * 63])),
         _node(_expr("In", ["v" * 64])),
         ("spec.placement.nodeAffinity.matchExpressions[0].values[0]", "63")),
    Rule("at most 1000 node requirements",
         _node(*[_expr("Exists", None, f"k{i}") for i in range(1000)]),
         _node(*[_expr("Exists", None, f"k{i}") for i in range(1001)]),
         ("spec.placement.nodeAffinity.matchExpressions", "1000")),
    Rule("toleration without a key is Exists",
         _set("placement", {"tolerations": [{"operator": "Exists"}]}),
         _set("placement", {"tolerations": [{"operator": "Equal", "value": "x"}]}),
         ("spec.placement.tolerations[0].operator", "operator Exists without a key")),
    Rule("toleration key a qualified name",
         _set("placement", {"tolerations": [{"key": QUALIFIED, "operator": "Exists"}]}),
         _set("placement", {"tolerations": [{"key": "a..b/nvme", "operator": "Exists"}]}),
         ("spec.placement.tolerations[0].key", "taint key")),
    Rule("toleration value a label value",
         _set("placement", {"tolerations": [{"key": "nvme", "value": "v" * 63}]}),
         _set("placement", {"tolerations": [{"key": "nvme", "value": "bad value"}]}),
         ("spec.placement.tolerations[0].value", "label value")),
    Rule("at most 1000 tolerations",
         _set("placement", {"tolerations": [{"key": f"k{i}", "operator": "Exists"}
                                            for i in range(1000)]}),
         _set("placement", {"tolerations": [{"key": f"k{i}", "operator": "Exists"}
                                            for i in range(1001)]}),
         ("spec.placement.tolerations", "1000")),
    Rule("toleration Exists has no value",
         _set("placement", {"tolerations": [{"key": "nvme", "operator": "Exists"}]}),
         _set("placement", {"tolerations": [{"key": "nvme", "operator": "Exists",
                                             "value": "yes"}]}),
         ("spec.placement.tolerations[0].value", "no value with operator Exists")),
    Rule("tolerationSeconds with NoExecute",
         _set("placement", {"tolerations": [{"key": "nvme", "effect": "NoExecute",
                                             "tolerationSeconds": 30}]}),
         _set("placement", {"tolerations": [{"key": "nvme", "effect": "NoSchedule",
                                             "tolerationSeconds": 30}]}),
         ("spec.placement.tolerations[0].tolerationSeconds", "NoExecute")),
    Rule("gs:// without a Secret", _set("storage", GS),
         _set("storage", {**GS, "credentialsSecretRef": {"name": "s3-creds"}}),
         ("spec.storage.credentialsSecretRef", "gs://")),
    Rule("gs:// without encryption", _set("storage", GS),
         _set("storage", {**GS, "encryption": {"type": "SSE-S3"}}),
         ("spec.storage.encryption", "gs://")),
    Rule("gs:// without addressing", _set("storage", GS),
         _set("storage", {**GS, "addressingStyle": "path"}),
         ("spec.storage.addressingStyle", "gs://")),
    Rule("kmsKeyId with SSE-KMS",
         _set("storage.encryption", {"type": "SSE-KMS", "kmsKeyId": "alias/ckpt"}),
         _set("storage.encryption", {"type": "SSE-S3", "kmsKeyId": "alias/ckpt"}),
         ("spec.storage.encryption.kmsKeyId", "SSE-KMS")),
    Rule("one CA bundle reference",
         _set("storage.caBundle", {"configMapKeyRef": {"name": "ca", "key": "ca.crt"}}),
         _set("storage.caBundle", {"configMapKeyRef": {"name": "ca", "key": "ca.crt"},
                                   "secretKeyRef": {"name": "ca", "key": "ca.crt"}}),
         ("spec.storage.caBundle", "exactly one of secretKeyRef or configMapKeyRef")),
    Rule("cold class of the store",
         _set("storage", {**GS, "coldStorage": {"storageClass": "NEARLINE"}}),
         _set("storage", {**S3, "coldStorage": {"storageClass": "NEARLINE"}}),
         ("spec.storage.coldStorage.storageClass", "s3://")),
    Rule("no cold class with file://",
         _set("storage", {**S3, "coldStorage": {"storageClass": "GLACIER_IR"}}),
         _set("storage", {"uri": "file:///data/ckpt",
                          "coldStorage": {"storageClass": "GLACIER_IR"}}),
         ("spec.storage.coldStorage.storageClass", "file://")),
    Rule("cold after below keep",
         _set("storage", {**S3, "keep": 4, "coldStorage": {"storageClass": "STANDARD_IA",
                                                          "after": 3}}),
         _set("storage", {**S3, "coldStorage": {"storageClass": "STANDARD_IA", "after": 3}}),
         ("spec.storage.coldStorage.after", "fewer than spec.storage.keep")),
    Rule("reserved name", _name("cluster-scale"), _name("cluster-scale.ckptdrain.io"),
         ("metadata.name", "cluster scale channel")),
    Rule("short name with the peer tier",
         _both(_name("a" * 63), _set("peerTier", PEER)),
         _both(_name(LONG_NAME), _set("peerTier", PEER)),
         ("metadata.name", "at most 63 characters with spec.peerTier.enabled")),
    Rule("long name without the peer tier", _name(LONG_NAME),
         _both(_name(LONG_NAME), _set("peerTier", PEER)), ("metadata.name", "63")),
    # Schema minimums, kept where they were.
    Rule("writers", _set("writers", 1), _set("writers", 0), ("spec.writers", "1")),
    Rule("globalEvery", _set("globalEvery", 1), _set("globalEvery", 0),
         ("spec.globalEvery", "1")),
    Rule("local keep", _set("localTier.keep", 1), _set("localTier.keep", 0),
         ("spec.localTier.keep", "1")),
    Rule("global keep", _set("storage.keep", 1), _set("storage.keep", 0),
         ("spec.storage.keep", "1")),
    Rule("peer keep", _set("peerTier", {**PEER, "keep": 1}),
         _set("peerTier", {**PEER, "keep": 0}), ("spec.peerTier.keep", "1")),
]


def _body(change: Change) -> dict[str, Any]:
    body = policy("cel")
    change(body)
    return body


def _dry_run(cluster: Cluster, namespace: str, body: dict[str, Any]) -> Any:
    return cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-",
                           input=json.dumps(body), check=False)


def _operator_problems(body: dict[str, Any]) -> list[str]:
    return [str(e) for e in operator_policy.validate(body["spec"], OperatorConfig(),
                                                     body["metadata"]["name"])]


@pytest.mark.parametrize("rule", RULES, ids=[r.label for r in RULES])
def test_the_apiserver_refuses_what_the_operator_refuses(
        cluster: Cluster, crds: None, namespace: str, rule: Rule) -> None:
    accepted, refused = _body(rule.accepted), _body(rule.refused)
    # The CRD is never stricter than the operator, nor these rows wrong.
    assert _operator_problems(accepted) == []
    assert _operator_problems(refused) != []

    ok = _dry_run(cluster, namespace, accepted)
    assert ok.returncode == 0, ok.stderr
    no = _dry_run(cluster, namespace, refused)
    assert no.returncode != 0, f"accepted: {refused}"
    # The apiserver's own validation (422 "is invalid"), not a webhook's.
    assert "is invalid" in no.stderr and "denied the request" not in no.stderr, no.stderr
    for text in rule.names:
        assert text in no.stderr, no.stderr


#: Policies at the edges of the CRD's bounds (the cost of its rules), which
#: the operator runs: accepted.
EDGES = {
    "200 hostnames": _node(_expr("In", [f"node-{i}" for i in range(200)],
                                 "kubernetes.io/hostname")),
    "100 tolerations": _set("placement", {"tolerations": [
        {"key": f"example.com/t{i}", "operator": "Exists"} for i in range(100)]}),
    "a 63-character node value": _node(_expr("NotIn", ["v" * 63, "w" * 63])),
    "a 317-character rank key": _set("identity", {"rankAnnotation": QUALIFIED}),
    "a long parameter count": _set("model", {"parameters": "405." + "0" * 200 + "B"}),
    "a long checkpoint size": _set("model", {"checkpointBytes": "5.67" + "0" * 200 + "TB"}),
    "a long overlap": _set("overlap", "0." + "0" * 30 + "1%"),
}


@pytest.mark.parametrize("label", sorted(EDGES))
def test_the_apiserver_accepts_what_the_operator_runs_at_the_edges(
        cluster: Cluster, crds: None, namespace: str, label: str) -> None:
    body = _body(EDGES[label])
    assert _operator_problems(body) == []
    ok = _dry_run(cluster, namespace, body)
    assert ok.returncode == 0, ok.stderr


def _shipped() -> dict[str, dict[str, Any]]:
    """Every CheckpointPolicy manifest outside docs/ (tests/docs covers those),
    placeholders filled as the e2e scenarios fill them."""
    root = repo_root()
    found: dict[str, dict[str, Any]] = {}
    for path in sorted([*(root / "e2e").rglob("*.yaml"), *(root / "charts").rglob("*.yaml"),
                        *(root / "benchmarks").rglob("*.yaml")]):
        if "templates" in path.parts:
            continue  # Helm templates, not manifests
        text = string.Template(path.read_text()).safe_substitute(
            NAMESPACE="default", CHECKPOINT_BYTES="50M", ALLOWED_ROOT="/mnt/ckptdrain",
            BUCKET="ckpt", S3_NAMESPACE="storage", S3_PORT="9000")
        try:
            docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
        except yaml.YAMLError:
            continue
        for i, doc in enumerate(docs):
            if doc.get("kind") == "CheckpointPolicy":
                found[f"{path.relative_to(root)}[{i}]"] = doc
    return found


SHIPPED = _shipped()


def test_the_shipped_policies_were_found() -> None:
    assert "e2e/scenario/policy.yaml[0]" in SHIPPED, sorted(SHIPPED)


@pytest.fixture(scope="module")
def converting_cluster() -> Iterator[Cluster]:
    """An apiserver of its own whose CheckpointPolicy CRD converts through a
    running /convert: a v1beta1 policy is stored as v1alpha1 only through it
    (the session's CRD names a Service nothing answers for here)."""
    apiserver.binaries_or_fail()
    with apiserver.running() as running, converting_crds(running, [CRD]):
        yield running


@pytest.mark.parametrize("label", sorted(SHIPPED))
def test_every_shipped_policy_is_accepted(converting_cluster: Cluster, label: str) -> None:
    body = copy.deepcopy(SHIPPED[label])
    body["metadata"].pop("namespace", None)
    result = _dry_run(converting_cluster, "default", body)
    assert result.returncode == 0, f"{label}: {result.stderr}"


def test_the_crd_rules_all_have_messages_naming_a_field() -> None:
    """Every rule says which field and what was expected (the text a user sees)."""
    found = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations", []):
                found.append(rule)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(yaml.safe_load(CRD.read_text()))
    assert len(found) >= 20
    for rule in found:
        text = rule.get("message") or rule.get("messageExpression", "")
        assert text.lstrip("'").startswith(("spec.", "metadata.")), rule
