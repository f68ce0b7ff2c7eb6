"""A CheckpointClass's spec.identity.googleServiceAccount and
spec.credentialsSecretRef against a real apiserver: the CRD's CEL rules
store a well-formed account ({namespace} in its id) and a Secret
reference, and refuse, naming the field, a malformed email or an account
id no namespace makes 6-30 characters, each as the operator's own parser
judges it; and through the real operator and webhook, a pod of a gs://
policy of such a class gets its namespace's account in restore and the
agent, and not in the trainer."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from cluster_helpers import INJECT, pod, policy
from test_checkpoint_class_crd import _class, _dry_run, crds_only  # noqa: F401
from test_checkpoint_classes import ROOT, checkpoint_class
from test_tenant_identity_pods import OURS, _containers, _create, _env

from ckptdrain.contract.env import Env
from ckptdrain.operator.policy import classes as class_policy
from support import apiserver
from support.apiserver import Cluster

GSA = "ckpt-{namespace}@my-project.iam.gserviceaccount.com"
ROLE = "arn:aws:iam::111122223333:role/ckpt-{namespace}"
GOOD = [
    {"googleServiceAccount": GSA},
    {"googleServiceAccount": "checkpoints@my-project.iam.gserviceaccount.com"},
    {"googleServiceAccount": "{namespace}@my-project.iam.gserviceaccount.com"},
    {"googleServiceAccount": "a" * 29 + "{namespace}@my-project.iam.gserviceaccount.com"},
    {"awsRoleArn": ROLE, "googleServiceAccount": GSA},
    {"awsRoleArn": ROLE, "audience": "sts.amazonaws.com", "expirationSeconds": 1200},
]
BAD = [
    ("not an email", {"googleServiceAccount": "ckpt"}, "spec.identity.googleServiceAccount"),
    ("another domain", {"googleServiceAccount": "ckpt-team@gmail.com"},
     "spec.identity.googleServiceAccount"),
    ("upper case", {"googleServiceAccount": "Ckpt-team@my-project.iam.gserviceaccount.com"},
     "spec.identity.googleServiceAccount"),
    ("placeholder in the project", {
        "googleServiceAccount": "ckpt-team@{namespace}.iam.gserviceaccount.com"},
     "spec.identity.googleServiceAccount"),
    ("another placeholder", {
        "googleServiceAccount": "ckpt-{team}@my-project.iam.gserviceaccount.com"},
     "spec.identity.googleServiceAccount"),
    ("id ending in -", {"googleServiceAccount": "checkpoints-@my-project.iam.gserviceaccount.com"},
     "no - last"),
    ("id ending in - after the namespace", {
        "googleServiceAccount": "ckpt-{namespace}-@my-project.iam.gserviceaccount.com"},
     "no - last"),
    ("id too short", {"googleServiceAccount": "ckpt@my-project.iam.gserviceaccount.com"},
     "6-30 characters"),
    ("id too long", {"googleServiceAccount": "a" * 31 + "@my-project.iam.gserviceaccount.com"},
     "6-30 characters"),
    ("too long with any namespace", {
        "googleServiceAccount": "a" * 30 + "{namespace}@my-project.iam.gserviceaccount.com"},
     "6-30 characters"),
    ("empty identity", {}, "awsRoleArn, googleServiceAccount, or both"),
    ("audience without a role", {"googleServiceAccount": GSA, "audience": "x"},
     "spec.identity.awsRoleArn: required with audience or expirationSeconds"),
]


def _parses(identity: dict[str, Any]) -> bool:
    body = _class("c", identity=identity)
    return not isinstance(class_policy.catalogue([body])["c"], class_policy.ClassInvalid)


@pytest.mark.parametrize("identity", GOOD)
def test_a_well_formed_identity_is_stored(crds_only: Cluster,  # noqa: F811
                                          identity: dict[str, Any]) -> None:
    created = _dry_run(crds_only, _class("google", identity=identity))
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["spec"]["identity"] == identity
    assert _parses(identity)  # the operator takes what the apiserver stores


@pytest.mark.parametrize(("identity", "names"), [(i, n) for _, i, n in BAD],
                         ids=[label for label, _, _ in BAD])
def test_the_apiserver_refuses_a_bad_identity_naming_the_field(
        crds_only: Cluster, identity: dict[str, Any], names: str) -> None:  # noqa: F811
    result = _dry_run(crds_only, _class("bad", identity=identity))
    assert result.returncode != 0, f"accepted: {identity}"
    assert "is invalid" in result.stderr and names in result.stderr, result.stderr
    assert not _parses(identity)  # as the operator would have


def test_a_credentials_secret_ref_is_stored_and_a_bad_one_refused(
        crds_only: Cluster) -> None:  # noqa: F811
    ref = {"name": "tenant-keys", "accessKeyIdKey": "id", "secretAccessKeyKey": "secret"}
    created = _dry_run(crds_only, _class("keys", credentialsSecretRef=ref))
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["spec"]["credentialsSecretRef"] == ref
    for bad, field in (({"name": "Tenant_Keys"}, "spec.credentialsSecretRef.name"),
                       ({}, "spec.credentialsSecretRef.name"),
                       ({"name": "k", "accessKeyIdKey": "a key"},
                        "spec.credentialsSecretRef.accessKeyIdKey")):
        refused = _dry_run(crds_only, _class("keys", credentialsSecretRef=bad))
        assert refused.returncode != 0, f"accepted: {bad}"
        assert field in refused.stderr, refused.stderr


def test_a_gs_policys_pod_gets_the_account_in_restore_and_the_agent_only(
        cluster: apiserver.Cluster, namespace: str,
        classes: Callable[..., None], apply: Callable[..., Any]) -> None:
    classes(checkpoint_class("per-tenant-gsa", identity={"googleServiceAccount": GSA}))
    admitted = apply(policy("gsa", checkpointClassName="per-tenant-gsa", writers=1,
                            localTier={"path": f"{ROOT}/gsa"},
                            storage={"uri": f"gs://ckpt-bucket/{namespace}/runs"}),
                     check=False)
    assert admitted.returncode == 0, admitted.stderr
    stored = _create(cluster, namespace, pod("w", {"app": "gsa", **INJECT},
                                             terminationGracePeriodSeconds=600))
    found = _containers(stored)
    expected = f"ckpt-{namespace}@my-project.iam.gserviceaccount.com"
    for name in OURS:
        assert _env(found[name])[Env.GOOGLE_SERVICE_ACCOUNT] == expected, name
    for name, container in found.items():
        if name not in OURS:
            assert Env.GOOGLE_SERVICE_ACCOUNT not in _env(container), name
