"""operator/admission/tenant_identity.py and the pod patch: in a namespace the
platform maps to a role, restore and the agent, and no other container,
get a token of their own and the variables that use it; the trainer's
identity is not carried into them; a policy's Secret still wins; an
unmapped namespace is patched exactly as before."""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

import jsonpatch
import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import injection, tenant_identity
from ckptdrain.operator.admission.cloud_identity import SKIP_ANNOTATION
from ckptdrain.operator.policy import spec as policy
from ckptdrain.operator.tenant_identities import WebIdentity

TENANT = WebIdentity("arn:aws:iam::111122223333:role/ckpt-ml", "ckptdrain.io/store", 1800)
BASE = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
CFG = dataclasses.replace(BASE, identities=(("ml", TENANT),))
SPEC = {
    "selector": {"matchLabels": {"app": "t"}}, "model": {"parameters": "7B"},
    "interval": "15m", "overlap": "10%", "writers": 2,
    "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2},
    "storage": {"uri": "s3://bucket/runs", "region": "eu-west-1"},
    "peerTier": {"enabled": True},
}
MAPPED = policy.parse("ml", "llama", SPEC, CFG)
UNMAPPED = policy.parse("other", "llama", SPEC, CFG)
WITH_SECRET = policy.parse("ml", "llama", {**SPEC, "storage": {
    "uri": "s3://bucket/runs", "credentialsSecretRef": {"name": "creds"}}}, CFG)
ON_GCS = policy.parse("ml", "llama", {**SPEC, "storage": {"uri": "gs://bucket/runs"}}, CFG)
TRAINER_ROLE = "arn:aws:iam::999999999999:role/shared"
IRSA_DIR = "/var/run/secrets/eks.amazonaws.com/serviceaccount"
OURS_TO_STORE = (injection.RESTORE, injection.AGENT)
IDENTITY_ENV = {"AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_SESSION_NAME",
                "AWS_STS_REGIONAL_ENDPOINTS", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"}


def pod(namespace: str = "ml") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-0", "namespace": namespace, "labels": {"app": "t"}},
            "spec": {"containers": [{"name": "trainer", "image": "t:1"},
                                    {"name": "logger", "image": "l:1"}]}}


def with_trainer_identity(p: dict[str, Any]) -> dict[str, Any]:
    """What EKS's identity webhook, run before ours, gives every container:
    the shared role, its token mount and volume, a region."""
    out = copy.deepcopy(p)
    out["spec"]["volumes"] = [{"name": "aws-iam-token", "projected": {"sources": [
        {"serviceAccountToken": {"audience": "sts.amazonaws.com", "expirationSeconds": 86400,
                                 "path": "token"}}]}}]
    for c in out["spec"]["containers"]:
        c["env"] = [{"name": "AWS_ROLE_ARN", "value": TRAINER_ROLE},
                    {"name": "AWS_WEB_IDENTITY_TOKEN_FILE", "value": f"{IRSA_DIR}/token"},
                    {"name": "AWS_DEFAULT_REGION", "value": "us-east-1"}]
        c["volumeMounts"] = [{"name": "aws-iam-token", "mountPath": IRSA_DIR, "readOnly": True}]
    return out


def inject(p: dict[str, Any], pol: policy.Policy = MAPPED,
           cfg: config.OperatorConfig = CFG, **kw: Any) -> dict[str, Any]:
    return jsonpatch.apply_patch(copy.deepcopy(p), injection.build_pod_patch(
        p, pol, cfg, default_rate=1e9, rank=0, **kw))


def by_name(p: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in p["spec"].get("initContainers", []) + p["spec"]["containers"]}


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env") or []}


def token_mounts(c: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in c.get("volumeMounts") or [] if m["name"] == tenant_identity.VOLUME]


def test_the_choice_is_the_namespaces_for_s3_without_a_secret() -> None:
    assert tenant_identity.chosen(MAPPED, CFG.identities) == TENANT
    assert tenant_identity.chosen(UNMAPPED, CFG.identities) is None
    assert tenant_identity.chosen(WITH_SECRET, CFG.identities) is None  # the policy asked
    assert tenant_identity.chosen(ON_GCS, CFG.identities) is None  # Google's, not AWS's
    assert tenant_identity.chosen(MAPPED, ()) is None


@pytest.mark.parametrize("namespace", ["ml", "a", "n" * 63])
def test_the_session_name_is_one_sts_takes(namespace: str) -> None:
    name = tenant_identity.session_name(namespace)
    assert re.fullmatch(r"[\w+=,.@-]{2,64}", name) and name.startswith("ckptdrain-")
    assert namespace[:20] in name


@pytest.mark.parametrize("reader", [False, True])
def test_only_our_containers_that_reach_the_store_get_the_token_and_variables(
        reader: bool) -> None:
    out = inject(pod(), reader=reader)
    volume = next(v for v in out["spec"]["volumes"] if v["name"] == tenant_identity.VOLUME)
    assert volume["projected"]["sources"] == [{"serviceAccountToken": {
        "audience": "ckptdrain.io/store", "expirationSeconds": 1800, "path": "token"}}]
    found = by_name(out)
    reaching = [injection.RESTORE] if reader else list(OURS_TO_STORE)
    for name in reaching:
        assert token_mounts(found[name]) == [{"name": tenant_identity.VOLUME, "readOnly": True,
                                              "mountPath": tenant_identity.TOKEN_DIR}]
        env = env_of(found[name])
        assert {k: env[k] for k in IDENTITY_ENV & set(env)} == {
            "AWS_ROLE_ARN": TENANT.role_arn,
            "AWS_WEB_IDENTITY_TOKEN_FILE": f"{tenant_identity.TOKEN_DIR}/token",
            "AWS_ROLE_SESSION_NAME": "ckptdrain-ml", "AWS_STS_REGIONAL_ENDPOINTS": "regional"}
        assert env["AWS_REGION"] == "eu-west-1"  # the policy's, for STS too
    others = [c for n, c in found.items() if n not in reaching]
    assert {c["name"] for c in others} >= {"trainer", "logger"}
    if not reader:
        assert {injection.PREPARE, "ckptdrain-peer"} <= {c["name"] for c in others}
    for c in others:
        assert token_mounts(c) == [] and not IDENTITY_ENV & set(env_of(c)), c["name"]


def test_the_trainers_identity_is_not_carried_into_ours_and_stays_its_own() -> None:
    given = with_trainer_identity(pod())
    out = inject(given)
    found = by_name(out)
    for name in OURS_TO_STORE:
        env, mounts = env_of(found[name]), found[name]["volumeMounts"]
        assert env["AWS_ROLE_ARN"] == TENANT.role_arn, name
        assert "aws-iam-token" not in {m["name"] for m in mounts}, name
        assert "AWS_DEFAULT_REGION" not in env, name  # nothing of the trainer's
        assert [e["name"] for e in found[name]["env"]].count("AWS_ROLE_ARN") == 1
    # The trainer keeps what the platform gave it, and nothing of ours.
    for name in ("trainer", "logger"):
        assert found[name]["volumeMounts"][0]["name"] == "aws-iam-token"
        assert env_of(found[name])["AWS_ROLE_ARN"] == TRAINER_ROLE
        assert token_mounts(found[name]) == []


def test_an_identity_webhook_after_ours_is_told_to_leave_our_containers_alone() -> None:
    skipped = inject(pod())["metadata"]["annotations"][SKIP_ANNOTATION].split(",")
    assert set(OURS_TO_STORE) <= set(skipped)
    # Unmapped, restore and the agent still take the pod's identity.
    unmapped = inject(pod("other"), UNMAPPED)["metadata"]["annotations"][SKIP_ANNOTATION]
    assert not set(OURS_TO_STORE) & set(unmapped.split(","))


def test_on_reinvocation_nothing_of_the_trainers_reaches_ours() -> None:
    """A webhook after ours gave only the application containers an identity
    (EKS Pod Identity here): ours, holding the tenant's, take none of it."""
    out = inject(pod())
    for c in out["spec"]["containers"]:
        c["env"] = [{"name": "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                     "value": "http://169.254.170.23/v1/credentials"},
                    {"name": "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
                     "value": "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount/t"}]
        c["volumeMounts"] = [{"name": "eks-pod-identity-token", "readOnly": True,
                              "mountPath": "/var/run/secrets/pods.eks.amazonaws.com/"
                                           "serviceaccount"}]
    out["spec"]["volumes"].append({"name": "eks-pod-identity-token", "projected": {
        "sources": [{"serviceAccountToken": {"audience": "pods.eks.amazonaws.com",
                                             "path": "t"}}]}})
    assert injection.reinvocation_patch(out) == []
    # The control: without the tenant's token, the same pod's would be carried.
    for c in out["spec"]["initContainers"]:
        c["volumeMounts"] = [m for m in c["volumeMounts"]
                             if m["name"] != tenant_identity.VOLUME]
        c["env"] = [e for e in c["env"] if e["name"] not in IDENTITY_ENV]
    assert injection.reinvocation_patch(out) != []


@pytest.mark.parametrize("trainer_identity", [False, True])
def test_an_unmapped_namespace_is_patched_exactly_as_before(trainer_identity: bool) -> None:
    given = with_trainer_identity(pod("other")) if trainer_identity else pod("other")
    ops = injection.build_pod_patch(given, UNMAPPED, CFG, default_rate=1e9, rank=0)
    assert ops == injection.build_pod_patch(given, UNMAPPED, BASE, default_rate=1e9, rank=0)
    assert tenant_identity.VOLUME not in str(ops)
    if trainer_identity:  # the trainer's, carried as before
        assert env_of(by_name(inject(given, UNMAPPED))[injection.AGENT])[
            "AWS_ROLE_ARN"] == TRAINER_ROLE


@pytest.mark.parametrize("pol", [WITH_SECRET, ON_GCS], ids=["secret", "gcs"])
def test_a_secret_or_a_gcs_store_wins_over_the_mapping(pol: policy.Policy) -> None:
    given = with_trainer_identity(pod())
    ops = injection.build_pod_patch(given, pol, CFG, default_rate=1e9, rank=0)
    assert ops == injection.build_pod_patch(given, pol, BASE, default_rate=1e9, rank=0)
    out = inject(given, pol)
    assert tenant_identity.VOLUME not in {v["name"] for v in out["spec"]["volumes"]}
    if pol is WITH_SECRET:
        agent = env_of(by_name(out)[injection.AGENT])
        assert "AWS_ROLE_ARN" not in agent
        assert agent["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "creds",
                                                               "key": "AWS_ACCESS_KEY_ID"}}


def test_the_mapped_identity_is_ambient_so_endpoints_stay_on_the_platforms_list() -> None:
    """No Secret: the namespace's role signs every request, so a policy still
    may not send it to an endpoint of its own choosing."""
    spec = {**SPEC, "storage": {"uri": "s3://bucket/runs", "endpoint": "https://evil.example"}}
    with pytest.raises(policy.PolicyInvalid, match=r"spec\.storage\.endpoint"):
        policy.parse("ml", "llama", spec, CFG)
    listed = dataclasses.replace(CFG, ambient_endpoints=(("https", "evil.example", 443),))
    allowed = policy.parse("ml", "llama", spec, listed)
    assert tenant_identity.chosen(allowed, listed.identities) == TENANT
