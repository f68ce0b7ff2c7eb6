"""A CheckpointClass's store identity and ambient endpoints, pure: its
spec.identity read (every problem naming its field) and made into each
namespace's role, winning over the chart's mapping for its policies; a
store entry's ambientIdentity letting a policy of that store without a
credentials Secret use the store's endpoint, and nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config, tenant_identities
from ckptdrain.operator.admission import tenant_identity
from ckptdrain.operator.policy import classes
from ckptdrain.operator.policy import spec as policy
from ckptdrain.operator.policy.class_identity import read_identity
from ckptdrain.operator.tenant_identities import WebIdentity

PER_NAMESPACE = "arn:aws:iam::111122223333:role/ckpt/{namespace}"
CHART_ROLE = "arn:aws:iam::111122223333:role/chart-ml"
CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0",
                            identities=(("ml", WebIdentity(CHART_ROLE)),))
MINIO = "https://minio.storage.svc.cluster.local:9000"
SPEC: dict[str, Any] = {
    "checkpointClassName": "c",
    "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
    "interval": "15m", "localTier": {"path": "/mnt/nvme/fast"},
    "storage": {"uri": "s3://ckpt/ml/runs"},
}


def body(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
            "metadata": {"name": "c"}, "spec": {"nodeTier": {"root": "/mnt/nvme"}, **spec}}


def resolve(spec: dict[str, Any], cls: dict[str, Any], namespace: str = "ml"
            ) -> classes.Resolution:
    return classes.resolve(namespace, spec, CFG, classes.catalogue([cls]))


def problems_of(raw: object) -> list[str]:
    found: list[InvalidInput] = []
    read_identity(raw, found)
    return [str(p) for p in found]


# spec.identity read


def test_an_identity_reads_as_written_with_the_chart_entry_defaults() -> None:
    cls = classes.read(body(identity={"awsRoleArn": PER_NAMESPACE}))
    assert cls.identity == WebIdentity(PER_NAMESPACE, tenant_identities.DEFAULT_AUDIENCE,
                                       tenant_identities.DEFAULT_EXPIRATION_S)
    assert classes.read(body()).identity is None


@pytest.mark.parametrize(("raw", "field"), [
    ("arn:aws:iam::111122223333:role/x", "spec.identity"),
    ({"audience": "sts.amazonaws.com"}, "spec.identity.awsRoleArn"),
    ({"awsRoleArn": "arn:aws:iam::1:role/x"}, "spec.identity.awsRoleArn"),
    ({"awsRoleArn": "arn:aws:iam::111122223333:role/{team}"}, "spec.identity.awsRoleArn"),
    ({"awsRoleArn": "arn:aws-{namespace}:iam::111122223333:role/x"},
     "spec.identity.awsRoleArn"),
    ({"awsRoleArn": PER_NAMESPACE, "audience": "sts amazonaws"}, "spec.identity.audience"),
    ({"awsRoleArn": PER_NAMESPACE, "expirationSeconds": 60},
     "spec.identity.expirationSeconds"),
    ({"awsRoleArn": PER_NAMESPACE, "roleArn": "x"}, "spec.identity.roleArn"),
])
def test_a_wrong_identity_is_named_by_its_field(raw: object, field: str) -> None:
    [problem] = problems_of(raw)
    assert problem.startswith(f"{field}: expected "), problem


def test_a_wrong_role_shows_the_arn_as_written_not_the_checked_sample() -> None:
    [problem] = problems_of({"awsRoleArn": "arn:aws:iam::111122223333:role/a b{namespace}"})
    assert "role/a b{namespace}" in problem


def test_a_class_with_a_wrong_identity_cannot_be_used() -> None:
    read = classes.catalogue([body(identity={"awsRoleArn": "role/x"})])["c"]
    assert isinstance(read, classes.ClassInvalid)
    assert read.errors[0].field == "spec.identity.awsRoleArn"


# the identity applied


def test_the_class_identity_is_the_namespace_role_and_wins_over_the_chart() -> None:
    resolution = resolve(SPEC, body(identity={"awsRoleArn": PER_NAMESPACE,
                                              "audience": "ckptdrain.io/store",
                                              "expirationSeconds": 1200}))
    assert resolution.resolved, resolution.problems
    p = policy.parse("ml", "p", resolution.spec, resolution.config)
    assert tenant_identity.chosen(p, resolution.config.identities) == WebIdentity(
        "arn:aws:iam::111122223333:role/ckpt/ml", "ckptdrain.io/store", 1200)
    # Another namespace's policy of the same class gets its own role.
    other = resolve({**SPEC, "storage": {"uri": "s3://ckpt/team-b/runs"}},
                    body(identity={"awsRoleArn": PER_NAMESPACE}), namespace="team-b")
    assert tenant_identities.of(other.config.identities, "team-b") == WebIdentity(
        "arn:aws:iam::111122223333:role/ckpt/team-b")


def test_without_a_class_identity_the_chart_mapping_stays() -> None:
    resolution = resolve(SPEC, body())
    p = policy.parse("ml", "p", resolution.spec, resolution.config)
    assert tenant_identity.chosen(p, resolution.config.identities) == WebIdentity(CHART_ROLE)


def test_a_credentials_secret_wins_over_the_class_identity() -> None:
    spec = {**SPEC, "storage": {"uri": "s3://ckpt/ml/runs",
                                "credentialsSecretRef": {"name": "keys"}}}
    resolution = resolve(spec, body(identity={"awsRoleArn": PER_NAMESPACE}))
    p = policy.parse("ml", "p", resolution.spec, resolution.config)
    assert tenant_identity.chosen(p, resolution.config.identities) is None


def test_a_role_name_too_long_for_the_namespace_refuses_its_policies_naming_the_field() -> None:
    namespace = "n" * 63
    resolution = resolve({**SPEC, "storage": {"uri": f"s3://ckpt/{namespace}/r"}},
                         body(identity={"awsRoleArn": "arn:aws:iam::111122223333:role/"
                                        "checkpoints-{namespace}"}), namespace=namespace)
    assert resolution.reason == classes.REFUSED
    [problem] = resolution.problems
    assert problem.field == "spec.identity.awsRoleArn"
    assert "CheckpointClass c" in str(problem) and f"checkpoints-{namespace}" in str(problem)


# stores[].ambientIdentity


def vouching(ambient: bool | None, endpoint: str = MINIO) -> dict[str, Any]:
    entry: dict[str, Any] = {"uriPrefix": "s3://ckpt/{namespace}", "endpoint": endpoint}
    if ambient is not None:
        entry["ambientIdentity"] = ambient
    return body(stores=[entry, {"uriPrefix": "s3://other/{namespace}", "endpoint": MINIO}])


def endpoint_problems(spec: dict[str, Any], cls: dict[str, Any]) -> list[str]:
    resolution = resolve(spec, cls)
    assert resolution.resolved, resolution.problems
    return [str(e) for e in policy.validate(resolution.spec, resolution.config, "p")]


# http is allowed, as in the chart's agent.ambientEndpoints, though the
# session token then travels in clear (docs/checkpoint-classes.md).
@pytest.mark.parametrize("endpoint", [MINIO, "http://minio.storage.svc.cluster.local:9000"])
def test_a_vouching_store_admits_a_policy_without_a_secret(endpoint: str) -> None:
    assert endpoint_problems(SPEC, vouching(True, endpoint)) == []


def test_a_store_vouches_for_its_one_origin_and_no_other() -> None:
    # A comma in the path is no list: the origin is the endpoint's own.
    cls = classes.read(vouching(True, "https://a.example.com/x,https://evil.example.com"))
    assert classes.vouched("ml", SPEC, cls.stores) == (("https", "a.example.com", 443),)


@pytest.mark.parametrize("ambient", [None, False])
def test_a_store_that_does_not_vouch_refuses_it_naming_the_field_and_the_way_out(
        ambient: bool | None) -> None:
    [problem] = endpoint_problems(SPEC, vouching(ambient))
    assert problem.startswith("spec.storage.endpoint: expected ")
    assert "spec.stores[].ambientIdentity" in problem and MINIO in problem


def test_the_vouching_covers_its_own_store_only() -> None:
    # The same endpoint, under the class's other entry, which does not vouch.
    [problem] = endpoint_problems({**SPEC, "storage": {"uri": "s3://other/ml/runs"}},
                                  vouching(True))
    assert problem.startswith("spec.storage.endpoint: expected ")


def test_a_vouched_endpoint_admits_a_private_ca_as_a_listed_one_does() -> None:
    spec = {**SPEC, "storage": {"uri": "s3://ckpt/ml/runs",
                                "caBundle": {"configMapKeyRef": {"name": "ca",
                                                                 "key": "ca.crt"}}}}
    assert endpoint_problems(spec, vouching(True)) == []
    [refused] = endpoint_problems(spec, vouching(None))
    assert refused.startswith("spec.storage.endpoint: expected "), refused


@pytest.mark.parametrize(("entry", "field"), [
    ({"uriPrefix": "s3://ckpt/x", "ambientIdentity": True}, "spec.stores[0].ambientIdentity"),
    ({"uriPrefix": "s3://ckpt/x", "endpoint": "https://*.example.com", "ambientIdentity": True},
     "spec.stores[0].endpoint"),
    ({"uriPrefix": "s3://ckpt/x", "endpoint": "https://a:9000,https://evil.example.com",
      "ambientIdentity": True}, "spec.stores[0].endpoint"),
    ({"uriPrefix": "gs://ckpt/x", "endpoint": MINIO, "ambientIdentity": True},
     "spec.stores[0].ambientIdentity"),
    ({"uriPrefix": "s3://ckpt/x", "endpoint": MINIO, "ambientIdentity": "yes"},
     "spec.stores[0].ambientIdentity"),
    ({"uriPrefix": "s3://ckpt/x", "endpoint": "http://u:p@minio:9000", "ambientIdentity": True},
     "spec.stores[0].endpoint"),
])
def test_a_store_that_cannot_vouch_is_named_by_its_field(entry: dict[str, Any],
                                                         field: str) -> None:
    read = classes.catalogue([body(stores=[entry])])["c"]
    assert isinstance(read, classes.ClassInvalid)
    assert [e.field for e in read.errors] == [field]
    assert "u:p" not in str(read)  # a password in an endpoint is never shown
