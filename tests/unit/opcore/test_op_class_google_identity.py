"""A CheckpointClass's Google service account and credentials Secret, pure:
spec.identity.googleServiceAccount read (a malformed email, or an account
id no namespace can make 6-30 characters, named by its field) and made
into each namespace's account for gs:// policies only, refused naming the
field, class and namespace where the namespace makes an id Google refuses;
given to restore and the agent, never the trainer. spec.credentialsSecretRef
filled into s3:// policies that name none, in the documented order: the
policy's Secret, the class's, the class's role, the chart's, the pods' own."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import jsonpatch
import pytest

from ckptdrain.contract.env import Env
from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config
from ckptdrain.operator.admission import injection, tenant_identity
from ckptdrain.operator.policy import classes
from ckptdrain.operator.policy import spec as policy
from ckptdrain.operator.tenant_identities import WebIdentity

GSA = "ckpt-{namespace}@my-project.iam.gserviceaccount.com"
ROLE = "arn:aws:iam::111122223333:role/ckpt-{namespace}"
CHART_ROLE = "arn:aws:iam::111122223333:role/chart-ml"
CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0",
                            identities=(("ml", WebIdentity(CHART_ROLE)),))
SPEC: dict[str, Any] = {
    "checkpointClassName": "c",
    "selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
    "interval": "15m", "localTier": {"path": "/mnt/nvme/fast"},
    "storage": {"uri": "gs://ckpt/ml/runs"},
}
ON_S3: dict[str, Any] = {**SPEC, "storage": {"uri": "s3://ckpt/ml/runs"}}
GOOGLE = Env.GOOGLE_SERVICE_ACCOUNT.value


def body(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
            "metadata": {"name": "c"}, "spec": {"nodeTier": {"root": "/mnt/nvme"}, **spec}}


def resolve(spec: dict[str, Any], cls: dict[str, Any], namespace: str = "ml"
            ) -> classes.Resolution:
    return classes.resolve(namespace, spec, CFG, classes.catalogue([cls]))


def parsed(spec: dict[str, Any], cls: dict[str, Any], namespace: str = "ml"
           ) -> tuple[policy.Policy, config.OperatorConfig]:
    resolution = resolve(spec, cls, namespace)
    assert resolution.resolved, resolution.problems
    return policy.parse(namespace, "p", resolution.spec, resolution.config), resolution.config


def account_of(spec: dict[str, Any], cls: dict[str, Any], namespace: str = "ml") -> str | None:
    p, cfg = parsed(spec, cls, namespace)
    return tenant_identity.google_account(p, cfg.google_accounts)


def role_of(spec: dict[str, Any], cls: dict[str, Any]) -> str | None:
    p, cfg = parsed(spec, cls)
    identity = tenant_identity.chosen(p, cfg.identities)
    return None if identity is None else identity.role_arn


# spec.identity.googleServiceAccount read


@pytest.mark.parametrize("email", [
    GSA, "checkpoints@my-project.iam.gserviceaccount.com", "{namespace}@my-project.iam."
    "gserviceaccount.com", "t-{namespace}-ckpt@proj-123.iam.gserviceaccount.com",
    # 24 characters besides the placeholder: a one-letter namespace fits 30.
    "abcdefghijklmnopqrstuvwx{namespace}----a@my-project.iam.gserviceaccount.com",
])
def test_a_google_service_account_reads_as_written(email: str) -> None:
    cls = classes.read(body(identity={"googleServiceAccount": email}))
    assert (cls.google_service_account, cls.identity) == (email, None)


@pytest.mark.parametrize("email", [
    "ckpt", "ckpt-team@my-project", "ckpt-team@gmail.com", "Ckpt-team@my-project.iam."
    "gserviceaccount.com", "ckpt_team@my-project.iam.gserviceaccount.com",
    "ckpt-team@{namespace}.iam.gserviceaccount.com", "ckpt-{team}@my-project.iam."
    "gserviceaccount.com", "1ckpt-team@my-project.iam.gserviceaccount.com",
    "ckpt-team@my-project.iam.gserviceaccount.com/x", 42,
])
def test_a_malformed_email_is_named_by_its_field(email: object) -> None:
    read = classes.catalogue([body(identity={"googleServiceAccount": email})])["c"]
    assert isinstance(read, classes.ClassInvalid)
    [problem] = read.errors
    assert problem.field == "spec.identity.googleServiceAccount"
    assert "<account id>@<project id>.iam.gserviceaccount.com" in str(problem)


@pytest.mark.parametrize("email", [
    "checkpoints-@my-project.iam.gserviceaccount.com",
    "ckpt-{namespace}-@my-project.iam.gserviceaccount.com",
    "abcdefghijklmnopqrstuvwx{namespace}-----@my-project.iam.gserviceaccount.com",
])
def test_an_account_id_ending_in_a_dash_is_refused_naming_the_form(email: str) -> None:
    # Google's ids end in a letter or digit, whatever the namespace.
    read = classes.catalogue([body(identity={"googleServiceAccount": email})])["c"]
    assert isinstance(read, classes.ClassInvalid)
    [problem] = read.errors
    assert problem.field == "spec.identity.googleServiceAccount"
    assert "no '-' last" in str(problem)


@pytest.mark.parametrize("email", [
    "ckpt@my-project.iam.gserviceaccount.com",  # 4: too short, with no namespace to add
    "a" * 31 + "@my-project.iam.gserviceaccount.com",
    # 30 without the placeholder: even a one-letter namespace makes 31.
    "a" * 30 + "{namespace}@my-project.iam.gserviceaccount.com",
])
def test_an_id_no_namespace_makes_6_to_30_characters_is_refused(email: str) -> None:
    read = classes.catalogue([body(identity={"googleServiceAccount": email})])["c"]
    assert isinstance(read, classes.ClassInvalid)
    [problem] = read.errors
    assert problem.field == "spec.identity.googleServiceAccount"
    assert "6-30 characters" in str(problem)


def test_an_aws_role_and_a_google_account_read_side_by_side() -> None:
    cls = classes.read(body(identity={"awsRoleArn": ROLE, "googleServiceAccount": GSA}))
    assert cls.identity == WebIdentity(ROLE) and cls.google_service_account == GSA


# the account applied


def test_a_gs_policy_gets_its_namespace_account_and_no_role() -> None:
    cls = body(identity={"awsRoleArn": ROLE, "googleServiceAccount": GSA})
    assert account_of(SPEC, cls) == "ckpt-ml@my-project.iam.gserviceaccount.com"
    other = {**SPEC, "storage": {"uri": "gs://ckpt/team-b/runs"}}
    assert account_of(other, cls, "team-b") == "ckpt-team-b@my-project.iam.gserviceaccount.com"


def test_an_s3_policy_gets_the_role_and_no_account() -> None:
    cls = body(identity={"awsRoleArn": ROLE, "googleServiceAccount": GSA})
    assert account_of(ON_S3, cls) is None
    assert role_of(ON_S3, cls) == "arn:aws:iam::111122223333:role/ckpt-ml"
    # A Google account alone leaves an s3:// policy the chart's role.
    assert role_of(ON_S3, body(identity={"googleServiceAccount": GSA})) == CHART_ROLE


def test_a_role_too_long_for_the_namespace_refuses_only_s3_policies() -> None:
    namespace = "n" * 63
    cls = body(identity={"awsRoleArn": "arn:aws:iam::111122223333:role/checkpoints-"
                         "{namespace}"})
    gs = resolve({**SPEC, "storage": {"uri": f"gs://ckpt/{namespace}/r"}}, cls, namespace)
    assert gs.resolved, gs.problems
    s3 = resolve({**SPEC, "storage": {"uri": f"s3://ckpt/{namespace}/r"}}, cls, namespace)
    assert [p.field for p in s3.problems] == ["spec.identity.awsRoleArn"]


@pytest.mark.parametrize(("namespace", "made"), [
    ("a-very-long-namespace-name", "ckpt-a-very-long-namespace-name"),  # 31
    ("x", "ckpt-x"),  # fits
    ("team-", None),
])
def test_a_namespace_making_an_invalid_id_refuses_its_gs_policies(
        namespace: str, made: str | None) -> None:
    cls = body(identity={"googleServiceAccount": GSA})
    resolution = resolve({**SPEC, "storage": {"uri": f"gs://ckpt/{namespace}/r"}}, cls,
                         namespace)
    if made == "ckpt-x":
        assert resolution.resolved, resolution.problems
        return
    assert resolution.reason == classes.REFUSED
    [problem] = resolution.problems
    assert problem.field == "spec.identity.googleServiceAccount"
    text = str(problem)
    assert "CheckpointClass c" in text and f"namespace {namespace}" in text
    assert f"ckpt-{namespace}@my-project.iam.gserviceaccount.com" in text
    assert "ClassResolved" not in text and "6-30" in text


def test_an_account_id_starting_with_the_namespace_refuses_a_namespace_of_a_digit() -> None:
    cls = body(identity={"googleServiceAccount": "{namespace}-ckpt@my-project.iam."
                                                 "gserviceaccount.com"})
    resolution = resolve({**SPEC, "storage": {"uri": "gs://ckpt/7teams/r"}}, cls, "7teams")
    assert resolution.reason == classes.REFUSED
    assert [p.field for p in resolution.problems] == ["spec.identity.googleServiceAccount"]
    assert "namespace 7teams" in str(resolution.problems[0])


# the pod: restore and the agent, never the trainer


def pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-0", "namespace": "ml", "labels": {"app": "t"}},
            "spec": {"containers": [{"name": "trainer", "image": "t:1"}]}}


def injected(spec: dict[str, Any], cls: dict[str, Any]) -> dict[str, dict[str, Any]]:
    p, cfg = parsed(spec, cls)
    out = jsonpatch.apply_patch(copy.deepcopy(pod()), injection.build_pod_patch(
        pod(), dataclasses.replace(p, trainer_access=True), cfg, default_rate=1e9, rank=0))
    return {c["name"]: c for c in out["spec"]["initContainers"] + out["spec"]["containers"]}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def test_restore_and_the_agent_get_the_account_and_the_trainer_does_not() -> None:
    found = injected(SPEC, body(identity={"googleServiceAccount": GSA}))
    for name in (injection.RESTORE, injection.AGENT):
        assert env_of(found[name])[GOOGLE] == "ckpt-ml@my-project.iam.gserviceaccount.com"
    assert GOOGLE not in env_of(found["trainer"])
    assert not any(GOOGLE in env_of(c) for n, c in found.items()
                   if n not in (injection.RESTORE, injection.AGENT))


def test_an_s3_policy_of_the_class_gets_no_google_account() -> None:
    found = injected(ON_S3, body(identity={"googleServiceAccount": GSA}))
    assert not any(GOOGLE in env_of(c) for c in found.values())


# spec.credentialsSecretRef


def test_the_class_secret_fills_an_s3_policy_naming_none() -> None:
    cls = body(credentialsSecretRef={"name": "tenant-keys"})
    p, _ = parsed(ON_S3, cls)
    assert p.credentials is not None and p.credentials.name == "tenant-keys"
    assert (p.credentials.access_key_id_key, p.credentials.secret_access_key_key) == (
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    keyed = body(credentialsSecretRef={"name": "tenant-keys", "accessKeyIdKey": "id",
                                       "secretAccessKeyKey": "secret"})
    p, _ = parsed(ON_S3, keyed)
    assert p.credentials is not None
    assert (p.credentials.access_key_id_key, p.credentials.secret_access_key_key) == (
        "id", "secret")
    # What restore and the agent get: the Secret's keys, by reference.
    found = injected(ON_S3, cls)
    for name in (injection.RESTORE, injection.AGENT):
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
                for e in found[name]["env"] if "valueFrom" in e and "secretKeyRef" in
                e["valueFrom"]}
        assert refs == {"AWS_ACCESS_KEY_ID": "tenant-keys",
                        "AWS_SECRET_ACCESS_KEY": "tenant-keys"}


def test_the_policy_secret_wins_over_the_class_secret() -> None:
    spec = {**ON_S3, "storage": {"uri": "s3://ckpt/ml/runs",
                                 "credentialsSecretRef": {"name": "own-keys"}}}
    p, _ = parsed(spec, body(credentialsSecretRef={"name": "tenant-keys"}))
    assert p.credentials is not None and p.credentials.name == "own-keys"


def test_the_class_secret_wins_over_the_class_role_and_the_chart_role() -> None:
    cls = body(credentialsSecretRef={"name": "tenant-keys"}, identity={"awsRoleArn": ROLE})
    assert role_of(ON_S3, cls) is None
    assert role_of(ON_S3, body(credentialsSecretRef={"name": "tenant-keys"})) is None
    # Without the Secret, the class's role; without either, the chart's.
    assert role_of(ON_S3, body(identity={"awsRoleArn": ROLE})) == \
        "arn:aws:iam::111122223333:role/ckpt-ml"
    assert role_of(ON_S3, body()) == CHART_ROLE


def test_a_gs_policy_is_given_no_secret() -> None:
    p, _ = parsed(SPEC, body(credentialsSecretRef={"name": "tenant-keys"}))
    assert p.credentials is None


@pytest.mark.parametrize(("raw", "field"), [
    ("tenant-keys", "spec.credentialsSecretRef"),
    ({}, "spec.credentialsSecretRef.name"),
    ({"name": "Tenant_Keys"}, "spec.credentialsSecretRef.name"),
    ({"name": "k", "accessKeyIdKey": "a key"}, "spec.credentialsSecretRef.accessKeyIdKey"),
    ({"name": "k", "secretAccessKeyKey": ""}, "spec.credentialsSecretRef.secretAccessKeyKey"),
    ({"name": "k", "namespace": "other"}, "spec.credentialsSecretRef.namespace"),
])
def test_a_wrong_secret_ref_is_named_by_its_field(raw: object, field: str) -> None:
    read = classes.catalogue([body(credentialsSecretRef=raw)])["c"]
    assert isinstance(read, classes.ClassInvalid)
    assert [e.field for e in read.errors] == [field]
    assert isinstance(read.errors[0], InvalidInput)
