"""operator/admission/cloud_identity.py and injection.reinvocation_patch: the identity
a platform webhook (EKS IRSA, EKS Pod Identity) gives the trainer reaches
restore and the agent whether that webhook runs before ours or after, and a
sidecar whose restartPolicy a stale webhook dropped gets it back."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import cloud_identity, injection
from ckptdrain.operator.policy import spec as policy

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
AMBIENT_SPEC = {
    "selector": {"matchLabels": {"app": "t"}}, "model": {"parameters": "7B"},
    "interval": "15m", "overlap": "10%", "writers": 2,
    "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2},
    "storage": {"uri": "s3://bucket/runs"},
}
AMBIENT = policy.parse("ml", "llama", AMBIENT_SPEC, CFG)
WITH_SECRET = policy.parse("ml", "llama", {
    **AMBIENT_SPEC, "storage": {"uri": "s3://bucket/runs",
                                "credentialsSecretRef": {"name": "creds"}}}, CFG)
PEERED = policy.parse("ml", "llama", {**AMBIENT_SPEC, "peerTier": {"enabled": True}}, CFG)
ROLE = "arn:aws:iam::111122223333:role/ckptdrain"
IRSA_DIR = "/var/run/secrets/eks.amazonaws.com/serviceaccount"
POD_IDENTITY_DIR = "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount"


def pod(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": [{"name": "trainer", "image": "t:1"}]}
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w-0", "namespace": "ml", "labels": {"app": "t"}},
            "spec": body}


def irsa(p: dict[str, Any], *, volume: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the EKS pod identity webhook does (IRSA): env and a token mount in
    every container present, and the projected token volume."""
    out = copy.deepcopy(p)
    spec = out["spec"]
    spec.setdefault("volumes", []).append(volume or {"name": "aws-iam-token", "projected": {
        "sources": [{"serviceAccountToken": {"audience": "sts.amazonaws.com",
                                             "expirationSeconds": 86400, "path": "token"}}]}})
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        c.setdefault("env", []).extend([
            {"name": "AWS_STS_REGIONAL_ENDPOINTS", "value": "regional"},
            {"name": "AWS_DEFAULT_REGION", "value": "us-east-1"},
            {"name": "AWS_REGION", "value": "us-east-1"},
            {"name": "AWS_ROLE_ARN", "value": ROLE},
            {"name": "AWS_WEB_IDENTITY_TOKEN_FILE", "value": f"{IRSA_DIR}/token"}])
        c.setdefault("volumeMounts", []).append(
            {"name": "aws-iam-token", "mountPath": IRSA_DIR, "readOnly": True})
    return out


def pod_identity(p: dict[str, Any]) -> dict[str, Any]:
    """EKS Pod Identity: the credentials URI and its token file."""
    out = copy.deepcopy(p)
    out["spec"].setdefault("volumes", []).append({"name": "eks-pod-identity-token", "projected": {
        "sources": [{"serviceAccountToken": {"audience": "pods.eks.amazonaws.com",
                                             "expirationSeconds": 86400,
                                             "path": "eks-pod-identity-token"}}]}})
    for c in out["spec"]["containers"]:
        c.setdefault("env", []).extend([
            {"name": "AWS_CONTAINER_CREDENTIALS_FULL_URI",
             "value": "http://169.254.170.23/v1/credentials"},
            {"name": "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
             "value": f"{POD_IDENTITY_DIR}/eks-pod-identity-token"}])
        c.setdefault("volumeMounts", []).append(
            {"name": "eks-pod-identity-token", "mountPath": POD_IDENTITY_DIR, "readOnly": True})
    return out


def inject(p: dict[str, Any], pol: policy.Policy = AMBIENT) -> dict[str, Any]:
    return jsonpatch.apply_patch(copy.deepcopy(p),
                                 injection.build_pod_patch(p, pol, CFG, default_rate=1e9))


def reinvoke(p: dict[str, Any]) -> dict[str, Any]:
    return jsonpatch.apply_patch(copy.deepcopy(p), injection.reinvocation_patch(p))


def containers(p: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in p["spec"].get("initContainers", []) + p["spec"]["containers"]}


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def mounts_of(c: dict[str, Any]) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}


def assert_has_irsa(c: dict[str, Any]) -> None:
    env = env_of(c)
    assert env["AWS_ROLE_ARN"] == ROLE, c["name"]
    assert env["AWS_WEB_IDENTITY_TOKEN_FILE"] == f"{IRSA_DIR}/token", c["name"]
    assert mounts_of(c)[IRSA_DIR] == "aws-iam-token", c["name"]
    assert [m["readOnly"] for m in c["volumeMounts"] if m["mountPath"] == IRSA_DIR] == [True]


def test_identity_given_before_ours_is_carried_into_restore_and_agent() -> None:
    out = inject(irsa(pod()))
    found = containers(out)
    for name in (injection.RESTORE, injection.AGENT):
        assert_has_irsa(found[name])
        assert env_of(found[name])["AWS_STS_REGIONAL_ENDPOINTS"] == "regional"
    # Nothing of it where the store is never reached, nothing twice.
    assert "AWS_ROLE_ARN" not in env_of(found[injection.PREPARE])
    names = [e["name"] for e in found[injection.AGENT]["env"]]
    assert len(names) == len(set(names))
    # Applying the patch again after the fact changes nothing.
    assert injection.reinvocation_patch(out) == []


def test_identity_given_after_ours_needs_nothing_on_reinvocation() -> None:
    # A current webhook after ours mutates every container, ours included.
    out = irsa(inject(pod()))
    for name in (injection.RESTORE, injection.AGENT):
        assert_has_irsa(containers(out)[name])
    assert injection.reinvocation_patch(out) == []


def test_a_webhook_that_skipped_our_containers_is_followed_on_reinvocation() -> None:
    # A webhook after ours that touched only the application containers.
    injected_first = inject(pod())
    trainer_only = copy.deepcopy(injected_first)
    trainer_only["spec"]["containers"] = irsa(pod())["spec"]["containers"]
    trainer_only["spec"]["volumes"] += irsa(pod())["spec"]["volumes"]
    out = reinvoke(trainer_only)
    for name in (injection.RESTORE, injection.AGENT):
        assert_has_irsa(containers(out)[name])
    assert injection.reinvocation_patch(out) == []


def test_pod_identity_credentials_uri_and_token_are_carried() -> None:
    found = containers(inject(pod_identity(pod())))
    for name in (injection.RESTORE, injection.AGENT):
        env = env_of(found[name])
        assert env["AWS_CONTAINER_CREDENTIALS_FULL_URI"] == "http://169.254.170.23/v1/credentials"
        assert env["AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"].startswith(POD_IDENTITY_DIR + "/")
        assert mounts_of(found[name])[POD_IDENTITY_DIR] == "eks-pod-identity-token"


def test_explicit_credentials_take_no_ambient_identity() -> None:
    found = containers(inject(irsa(pod()), WITH_SECRET))
    for name in (injection.RESTORE, injection.AGENT):
        env = env_of(found[name])
        assert env["AWS_ACCESS_KEY_ID"]["secretKeyRef"]["name"] == "creds"
        assert "AWS_ROLE_ARN" not in env and IRSA_DIR not in mounts_of(found[name])


def test_the_policy_region_is_kept() -> None:
    regional = policy.parse("ml", "llama", {**AMBIENT_SPEC, "storage": {
        "uri": "s3://bucket/runs", "region": "eu-west-1"}}, CFG)
    agent = containers(inject(irsa(pod()), regional))[injection.AGENT]
    assert env_of(agent)["AWS_REGION"] == "eu-west-1"
    assert [e["name"] for e in agent["env"]].count("AWS_REGION") == 1
    assert env_of(agent)["AWS_ROLE_ARN"] == ROLE


def test_the_peer_sidecar_gets_no_identity_and_keeps_its_restart_policy() -> None:
    found = containers(inject(irsa(pod()), PEERED))
    peer = found["ckptdrain-peer"]
    assert "AWS_ROLE_ARN" not in env_of(peer) and peer["restartPolicy"] == "Always"
    assert_has_irsa(found[injection.AGENT])


def test_a_token_outside_a_projected_token_volume_is_not_carried() -> None:
    host = {"name": "aws-iam-token", "hostPath": {"path": "/etc/aws"}}
    p = irsa(pod(), volume=host)
    found = cloud_identity.ambient(p)
    assert "AWS_WEB_IDENTITY_TOKEN_FILE" not in [e["name"] for e in found.env]
    assert found.mounts == [] and "not a file of a projected" in found.problems[0]
    agent = containers(inject(p))[injection.AGENT]
    assert "AWS_WEB_IDENTITY_TOKEN_FILE" not in env_of(agent)
    assert IRSA_DIR not in mounts_of(agent)


def test_a_path_taken_in_our_container_blocks_the_mount_and_its_variable() -> None:
    found = cloud_identity.ambient(irsa(pod()))
    ours = {"name": "x", "env": [],
            "volumeMounts": [{"name": "other", "mountPath": IRSA_DIR}]}
    env, mounts = cloud_identity.additions(ours, found)
    assert mounts == [] and env == []  # a role without its token is no identity


def test_a_dropped_sidecar_restart_policy_is_restored() -> None:
    # A webhook built on Kubernetes types older than native sidecars
    # re-encodes initContainers without the field.
    stale = inject(pod(), PEERED)
    for c in stale["spec"]["initContainers"]:
        c.pop("restartPolicy", None)
    out = reinvoke(stale)
    policies = {c["name"]: c.get("restartPolicy") for c in out["spec"]["initContainers"]}
    assert policies == {"ckptdrain-prepare": None, "ckptdrain-peer": "Always",
                        "ckptdrain-restore": None, "ckptdrain-agent": "Always"}
    assert injection.reinvocation_patch(out) == []


def test_a_pod_without_identity_is_left_alone() -> None:
    out = inject(pod())
    assert injection.reinvocation_patch(out) == []
    assert cloud_identity.ambient(out) == cloud_identity.Ambient()


def test_a_region_alone_is_no_identity() -> None:
    p = pod()
    p["spec"]["containers"][0]["env"] = [{"name": "AWS_REGION", "value": "ap-south-1"}]
    assert cloud_identity.ambient(p) == cloud_identity.Ambient()
    assert "AWS_REGION" not in env_of(containers(inject(p))[injection.AGENT])


def test_the_first_container_with_a_credential_is_the_source() -> None:
    p = irsa(pod())
    # A first container the platform skipped, with only a region.
    p["spec"]["containers"].insert(0, {"name": "logger", "image": "l:1", "env": [
        {"name": "AWS_REGION", "value": "ap-south-1"}]})
    agent = containers(inject(p))[injection.AGENT]
    assert_has_irsa(agent)
    assert env_of(agent)["AWS_REGION"] == "us-east-1"


def test_a_credential_without_its_token_file_is_not_carried() -> None:
    p = pod_identity(pod())
    env = p["spec"]["containers"][0]["env"]
    env[:] = [e for e in env if e["name"] != "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"]
    found = cloud_identity.ambient(p)
    assert found.env == [] and "without AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE" in found.problems[0]
    agent = containers(inject(p))[injection.AGENT]
    assert "AWS_CONTAINER_CREDENTIALS_FULL_URI" not in env_of(agent)


@pytest.mark.parametrize("mount_path", ["/ckptdrain/work/", "/tmp", "/ckptdrain",
                                        "/ckptdrain/local/aws", "/etc/aws"])
def test_a_token_mount_outside_the_secrets_root_is_not_carried(mount_path: str) -> None:
    p = irsa(pod())
    trainer = p["spec"]["containers"][0]
    trainer["volumeMounts"][0]["mountPath"] = mount_path
    for e in trainer["env"]:
        if e["name"] == "AWS_WEB_IDENTITY_TOKEN_FILE":
            e["value"] = mount_path.rstrip("/") + "/token"
    found = cloud_identity.ambient(p)
    assert found.env == [] and found.mounts == [] and "outside" in found.problems[0]
    out = containers(inject(p))
    for name in (injection.RESTORE, injection.AGENT):
        assert "AWS_ROLE_ARN" not in env_of(out[name])
        assert len(out[name]["volumeMounts"]) == len({m["mountPath"] for m in
                                                      out[name]["volumeMounts"]})


def test_values_that_refer_to_other_variables_are_not_carried() -> None:
    p = irsa(pod())
    for e in p["spec"]["containers"][0]["env"]:
        if e["name"] == "AWS_ROLE_ARN":
            e["value"] = "arn:aws:iam::1:role/$(TEAM)"
    found = cloud_identity.ambient(p)
    assert found.env == [] and "refers to other variables" in found.problems[0]


def test_a_policy_region_under_either_name_keeps_both_of_the_trainers_out() -> None:
    agent = {"name": "a", "env": [{"name": "AWS_DEFAULT_REGION", "value": "eu-west-1"}]}
    env, _ = cloud_identity.additions(agent, cloud_identity.ambient(irsa(pod())))
    names = [e["name"] for e in env]
    assert "AWS_ROLE_ARN" in names and "AWS_REGION" not in names
    assert "AWS_DEFAULT_REGION" not in names


def test_platform_webhooks_are_asked_to_skip_what_never_uses_ambient_identity() -> None:
    key = cloud_identity.SKIP_ANNOTATION
    assert inject(pod(), PEERED)["metadata"]["annotations"][key] == \
        "ckptdrain-prepare,ckptdrain-peer"
    assert inject(pod(), WITH_SECRET)["metadata"]["annotations"][key] == \
        "ckptdrain-prepare,ckptdrain-restore,ckptdrain-agent"
    own = pod()
    own["metadata"]["annotations"] = {key: "sidecar-x"}
    assert inject(own)["metadata"]["annotations"][key] == "sidecar-x,ckptdrain-prepare"
    own["metadata"]["annotations"] = {key: "ckptdrain-prepare"}
    assert inject(own)["metadata"]["annotations"][key] == "ckptdrain-prepare"
