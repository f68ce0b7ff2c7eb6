"""The CheckpointClass CRD and CheckpointPolicy's spec.checkpointClassName
against a real apiserver: a well-formed class is stored (spec.namespaces
defaulting to from: All; a placement of nodes), each CEL rule
refuses a bad one naming the field, and a policy's class cannot be changed
once set (the message says to make a new policy).

An apiserver of this module's own, with only the CRDs: these are the
apiserver's own judgements, made also when no operator answers."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_helpers import policy
from operator_process import repo_root

from support import apiserver
from support.apiserver import Cluster
from support.conversion_server import converting_crds

CRDS = [repo_root() / "crds" / name for name in ("checkpointclasses.yaml",
                                                  "checkpointpolicies.yaml")]


def _class(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "nodeTier": {"root": "/mnt/nvme"},
        "stores": [{"uriPrefix": "s3://ckpt-bucket/{namespace}",
                    "endpoint": "http://minio.storage:9000", "addressingStyle": "path"}],
        "resources": {"qos": "Burstable",
                      "agent": {"requests": {"cpu": "200m", "memory": "512Mi"},
                                "limits": {"memory": "2Gi"}, "max": {"memory": "4Gi"}}},
        "agentImage": "registry.example/ckptdrain:1.2.3",
        "bandwidthWeight": 4,
    }
    body.update(spec)
    return {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
            "metadata": {"name": name}, "spec": body}


@pytest.fixture(scope="module")
def crds_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The two CRDs, the policy's converting (its tests write v1alpha1,
    v1beta1 is stored): no operator, no admission webhook."""
    apiserver.binaries_or_fail()
    with apiserver.running(tmp_path_factory.mktemp("class-crd-apiserver")) as running, \
            converting_crds(running, CRDS):
        yield running


def _dry_run(cluster: Cluster, body: dict[str, Any]) -> Any:
    return cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                           input=json.dumps(body), check=False)


def test_a_well_formed_class_is_stored_cluster_scoped(crds_only: Cluster) -> None:
    created = _dry_run(crds_only, _class("fast"))
    assert created.returncode == 0, created.stderr
    stored = json.loads(created.stdout)
    assert "namespace" not in stored["metadata"]
    assert stored["spec"]["stores"][0]["uriPrefix"] == "s3://ckpt-bucket/{namespace}"


ROLE = "arn:aws:iam::111122223333:role/ckpt-{namespace}"


def test_an_identity_and_a_vouching_store_are_stored(crds_only: Cluster) -> None:
    stores = [{"uriPrefix": "s3://ckpt-bucket/{namespace}", "endpoint":
               "https://minio.storage.svc.cluster.local:9000", "ambientIdentity": True}]
    created = _dry_run(crds_only, _class("vouching", stores=stores, identity={
        "awsRoleArn": ROLE, "audience": "ckptdrain.io/store", "expirationSeconds": 1200}))
    assert created.returncode == 0, created.stderr
    spec = json.loads(created.stdout)["spec"]
    assert spec["identity"]["awsRoleArn"] == ROLE and spec["stores"] == stores


def _tier(**placement: Any) -> dict[str, Any]:
    return {"root": "/mnt/nvme", **placement}


def _agent(**amounts: Any) -> dict[str, Any]:
    return {"qos": "Burstable", "agent": amounts}


def _reclaim(**reclaim: Any) -> dict[str, Any]:
    return {"nodeTier": {"root": "/mnt/nvme", "reclaim": reclaim}}


def test_a_reclaim_is_stored_and_either_field_may_be_left_out(crds_only: Cluster) -> None:
    for reclaim in ({"policy": "Retain", "gracePeriod": "1h30m"}, {"policy": "Delete"},
                    {"gracePeriod": "0.5s"}, {}):
        created = _dry_run(crds_only, _class("tier", **_reclaim(**reclaim)))
        assert created.returncode == 0, (reclaim, created.stderr)
        assert json.loads(created.stdout)["spec"]["nodeTier"]["reclaim"] == reclaim


BAD = [
    ("reclaim policy unknown", _reclaim(policy="Recycle"), "spec.nodeTier.reclaim.policy"),
    ("grace without a unit", _reclaim(gracePeriod="90"), "spec.nodeTier.reclaim.gracePeriod"),
    ("grace not a duration", _reclaim(gracePeriod="soon"), "spec.nodeTier.reclaim.gracePeriod"),
    ("grace of zero", _reclaim(gracePeriod="0s"), "spec.nodeTier.reclaim.gracePeriod: a positive"),
    ("grace negative", _reclaim(gracePeriod="-1h"), "spec.nodeTier.reclaim.gracePeriod"),
    ("root relative", {"nodeTier": {"root": "mnt/nvme"}}, "spec.nodeTier.root"),
    ("root is /", {"nodeTier": {"root": "/"}}, "spec.nodeTier.root"),
    ("root climbs", {"nodeTier": {"root": "/mnt/../etc"}}, "spec.nodeTier.root"),
    ("no root", {"nodeTier": {}}, "spec.nodeTier.root"),
    ("prefix not a store", {"stores": [{"uriPrefix": "file:///data"}]},
     "spec.stores[0].uriPrefix"),
    ("prefix without bucket", {"stores": [{"uriPrefix": "s3://"}]}, "spec.stores[0].uriPrefix"),
    ("unknown placeholder", {"stores": [{"uriPrefix": "s3://ckpt-bucket/{name}"}]},
     "{namespace}"),
    ("lone brace", {"stores": [{"uriPrefix": "s3://ckpt-bucket/team}"}]}, "{namespace}"),
    ("gs with a region", {"stores": [{"uriPrefix": "gs://ckpt-bucket/x", "region": "eu"}]},
     "gs://"),
    ("endpoint not a URL", {"stores": [{"uriPrefix": "s3://ckpt-bucket/x",
                                        "endpoint": "minio:9000"}]},
     "spec.stores[0].endpoint"),
    ("request above limit", {"resources": _agent(requests={"memory": "2Gi"},
                                                 limits={"memory": "1Gi"})},
     "requests.memory: at most limits.memory"),
    ("request above max", {"resources": _agent(requests={"cpu": "3"}, max={"cpu": "2"})},
     "requests.cpu: at most max.cpu"),
    ("guaranteed above max", {"resources": _agent(guaranteed={"memory": "9Gi"},
                                                  max={"memory": "8Gi"})},
     "guaranteed.memory: at most max.memory"),
    ("not a quantity", {"resources": _agent(requests={"cpu": "lots"})},
     "spec.resources.agent.requests.cpu"),
    ("qos unknown", {"resources": {"qos": "BestEffort"}}, "spec.resources.qos"),
    ("weight zero", {"bandwidthWeight": 0}, "spec.bandwidthWeight"),
    ("weight too big", {"bandwidthWeight": 1001}, "spec.bandwidthWeight"),
    ("Selector without a selector", {"namespaces": {"from": "Selector"}},
     "spec.namespaces.selector: required with from: Selector"),
    ("a selector with All", {"namespaces": {"from": "All", "selector": {
        "matchLabels": {"tenant": "a"}}}}, "spec.namespaces.selector: only with from: Selector"),
    ("from unknown", {"namespaces": {"from": "Same"}}, "spec.namespaces.from"),
    ("vouching without an endpoint", {"stores": [{"uriPrefix": "s3://ckpt-bucket/x",
                                                  "ambientIdentity": True}]},
     "spec.stores[0].ambientIdentity"),
    ("vouching for gs", {"stores": [{"uriPrefix": "gs://ckpt-bucket/x", "ambientIdentity": True,
                                     "endpoint": "https://storage.example"}]},
     "spec.stores[0].ambientIdentity"),
    ("identity without a role", {"identity": {"audience": "sts.amazonaws.com"}},
     "spec.identity.awsRoleArn"),
    ("role not an ARN", {"identity": {"awsRoleArn": "role/ckpt"}}, "spec.identity.awsRoleArn"),
    ("role ending in a slash", {"identity": {"awsRoleArn": "arn:aws:iam::111122223333:role/x/"}},
     "spec.identity.awsRoleArn"),
    ("role with an empty path segment", {"identity": {
        "awsRoleArn": "arn:aws:iam::111122223333:role//x"}}, "spec.identity.awsRoleArn"),
    ("role name over 64 characters", {"identity": {
        "awsRoleArn": "arn:aws:iam::111122223333:role/p/" + "r" * 65}}, "spec.identity.awsRoleArn"),
    ("vouching for a wildcard", {"stores": [{"uriPrefix": "s3://ckpt-bucket/x", "ambientIdentity":
                                             True, "endpoint": "https://*.example.com"}]},
     "spec.stores[0].endpoint"),
    ("vouching for a list", {"stores": [{"uriPrefix": "s3://ckpt-bucket/x", "ambientIdentity": True,
                                         "endpoint": "https://a:9000,https://evil.example.com"}]},
     "spec.stores[0].endpoint"),
    ("vouching with a password", {"stores": [{"uriPrefix": "s3://ckpt-bucket/x", "ambientIdentity":
                                              True, "endpoint": "https://u:p@minio.example:9000"}]},
     "spec.stores[0].endpoint"),
    ("role with another placeholder", {"identity": {
        "awsRoleArn": "arn:aws:iam::111122223333:role/{team}"}}, "spec.identity.awsRoleArn"),
    ("token too short-lived", {"identity": {"awsRoleArn": ROLE, "expirationSeconds": 60}},
     "spec.identity.expirationSeconds"),
    ("In without values", {"namespaces": {"from": "Selector", "selector": {
        "matchExpressions": [{"key": "tenant", "operator": "In"}]}}},
     "at least one value with operator In or NotIn"),
    ("node label key with a space", {"nodeTier": _tier(nodeSelector={"node pool": "nvme"})},
     "spec.nodeTier.nodeSelector: node pool is no node label key"),
    ("node label key with an empty prefix", {"nodeTier": _tier(nodeSelector={"/pool": "nvme"})},
     "spec.nodeTier.nodeSelector: /pool is no node label key"),
    ("node label value with a slash", {"nodeTier": _tier(nodeSelector={"pool": "nvme/a"})},
     "spec.nodeTier.nodeSelector: each value a label value"),
    ("Exists with a value", {"nodeTier": _tier(tolerations=[
        {"key": "nvme", "operator": "Exists", "value": "true"}])},
     "spec.nodeTier.tolerations: no value with operator Exists"),
    ("unknown taint effect", {"nodeTier": _tier(tolerations=[
        {"key": "nvme", "operator": "Exists", "effect": "NoRun"}])},
     "spec.nodeTier.tolerations[0].effect"),
    ("Equal without a key", {"nodeTier": _tier(tolerations=[{"key": "", "value": "x"}])},
     "spec.nodeTier.tolerations.key: a key is required"),
    ("Exists without a key", {"nodeTier": _tier(tolerations=[{"operator": "Exists"}])},
     "spec.nodeTier.tolerations.key: a key is required"),
    ("bad taint key", {"nodeTier": _tier(tolerations=[{"key": "a b", "operator": "Exists"}])},
     "spec.nodeTier.tolerations.key: a taint key"),
    ("tolerationSeconds without NoExecute", {"nodeTier": _tier(tolerations=[
        {"key": "nvme", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}])},
     "spec.nodeTier.tolerations: tolerationSeconds only with effect NoExecute"),
]


def test_a_class_with_placement_is_stored(crds_only: Cluster) -> None:
    tier = _tier(nodeSelector={"example.com/pool": "nvme", "tier": ""}, tolerations=[
        {"key": "example.com/nvme", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "ckpt", "effect": "NoExecute", "tolerationSeconds": 30},
        {"key": "example.com/gpu", "operator": "Exists", "effect": ""}])
    created = _dry_run(crds_only, _class("placed", nodeTier=tier))
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["spec"]["nodeTier"] == tier


def test_namespaces_default_to_every_one_and_a_selector_is_stored(crds_only: Cluster) -> None:
    opened = json.loads(_dry_run(crds_only, _class("open", namespaces={})).stdout)
    assert opened["spec"]["namespaces"] == {"from": "All"}
    selector = {"matchLabels": {"example.com/tenant": "team-a"}}
    chosen = _dry_run(crds_only, _class("chosen", namespaces={"from": "Selector",
                                                              "selector": selector}))
    assert chosen.returncode == 0, chosen.stderr
    assert json.loads(chosen.stdout)["spec"]["namespaces"]["selector"] == selector


@pytest.mark.parametrize(("change", "names"), [(c, n) for _, c, n in BAD],
                         ids=[label for label, _, _ in BAD])
def test_the_apiserver_refuses_a_bad_class_naming_the_field(
        crds_only: Cluster, change: dict[str, Any], names: str) -> None:
    body = _class("bad", **change)
    result = _dry_run(crds_only, body)
    assert result.returncode != 0, f"accepted: {body['spec']}"
    assert "is invalid" in result.stderr and names in result.stderr, result.stderr


def test_a_listed_stores_endpoint_is_fixed(crds_only: Cluster) -> None:
    """A new endpoint under the same uriPrefix would send new pods of running
    policies to another store than their running pods; another uriPrefix, or
    removing the entry, is allowed."""
    body = _class("fixed-endpoint")
    apply = ["apply", "--server-side", "--force-conflicts", "-f", "-"]
    assert crds_only.kubectl(*apply, input=json.dumps(body), check=False).returncode == 0
    moved = copy.deepcopy(body)
    moved["spec"]["stores"][0]["endpoint"] = "http://other.storage:9000"
    refused = crds_only.kubectl(*apply, input=json.dumps(moved), check=False)
    assert refused.returncode != 0
    assert "spec.stores[0].endpoint" in refused.stderr and "fixed" in refused.stderr, (
        refused.stderr)
    dropped = copy.deepcopy(body)
    del dropped["spec"]["stores"][0]["endpoint"]
    assert crds_only.kubectl(*apply, input=json.dumps(dropped), check=False).returncode != 0
    added = copy.deepcopy(body)
    added["spec"]["stores"].append({"uriPrefix": "s3://new-bucket/{namespace}",
                                    "endpoint": "http://other.storage:9000"})
    grown = crds_only.kubectl(*apply, input=json.dumps(added), check=False)
    assert grown.returncode == 0, grown.stderr
    added["spec"]["stores"] = added["spec"]["stores"][1:]
    shrunk = crds_only.kubectl(*apply, input=json.dumps(added), check=False)
    assert shrunk.returncode == 0, shrunk.stderr


def test_quantities_are_compared_as_amounts_not_text(crds_only: Cluster) -> None:
    """512Mi is below 1Gi, and 1500m below 2, although not as text."""
    body = _class("amounts", resources=_agent(requests={"memory": "512Mi", "cpu": "1500m"},
                                              limits={"memory": "1Gi", "cpu": 2}))
    result = _dry_run(crds_only, body)
    assert result.returncode == 0, result.stderr


def _apply(cluster: Cluster, body: dict[str, Any]) -> Any:
    return cluster.kubectl("apply", "--server-side", "--force-conflicts", "-n", "default",
                           "-f", "-", input=json.dumps(body), check=False)


def test_a_policy_keeps_its_class_once_set(crds_only: Cluster) -> None:
    body = policy("classed", checkpointClassName="fast")
    created = _apply(crds_only, body)
    assert created.returncode == 0, created.stderr
    moved = copy.deepcopy(body)
    moved["spec"]["checkpointClassName"] = "slow"
    refused = _apply(crds_only, moved)
    assert refused.returncode != 0
    assert "spec.checkpointClassName" in refused.stderr, refused.stderr
    assert "new policy" in refused.stderr, refused.stderr
    dropped = copy.deepcopy(body)
    del dropped["spec"]["checkpointClassName"]
    assert _apply(crds_only, dropped).returncode != 0
    same = _apply(crds_only, body)
    assert same.returncode == 0, same.stderr


def test_a_policy_without_a_class_may_not_name_one_later(crds_only: Cluster) -> None:
    """A class is bound at creation: a policy created classless (no default
    class then) stays so; moving it into a class is a new policy."""
    body = policy("unclassed")
    assert _apply(crds_only, body).returncode == 0
    body["spec"]["checkpointClassName"] = "fast"
    named = _apply(crds_only, body)
    assert named.returncode != 0
    assert "spec.checkpointClassName" in named.stderr, named.stderr
    assert "make a new policy" in named.stderr, named.stderr
