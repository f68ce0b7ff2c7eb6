"""The trainer in a namespace the platform maps to a role: no store identity
unless its policy asks (spec.storage.trainerAccess), then the namespace's,
through the same token restore and the agent mount; admission says which
of the two a pod got, and says when a container holds a role of its own."""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

import jsonpatch
import pytest
from test_op_tenant_identity import (
    BASE,
    CFG,
    IDENTITY_ENV,
    OURS_TO_STORE,
    SPEC,
    TENANT,
    TRAINER_ROLE,
    by_name,
    env_of,
    pod,
    token_mounts,
    with_trainer_identity,
)

from ckptdrain.errors import InvalidInput
from ckptdrain.operator import config
from ckptdrain.operator.admission import injection, tenant_identity
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission.cloud_identity import SKIP_ANNOTATION
from ckptdrain.operator.policy import spec as policy

ASKS = {**SPEC, "storage": {**SPEC["storage"], "trainerAccess": True}}
APPLICATION = ("trainer", "logger")
NO_IDENTITY = ("the trainer gets no store identity in namespace ml; set "
               "spec.storage.trainerAccess to let it read checkpoints itself (DCP load, "
               "resharding)")
POD_IDENTITY_ENV = [
    {"name": "AWS_CONTAINER_CREDENTIALS_FULL_URI",
     "value": "http://169.254.170.23/v1/credentials"},
    {"name": "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
     "value": "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount/eks-pod-identity-token"}]


def parsed(spec: dict[str, Any], namespace: str = "ml",
           cfg: config.OperatorConfig = CFG) -> policy.Policy:
    return policy.parse(namespace, "llama", spec, cfg)


def inject(p: dict[str, Any], pol: policy.Policy, cfg: config.OperatorConfig = CFG,
           **kw: Any) -> dict[str, Any]:
    return jsonpatch.apply_patch(copy.deepcopy(p), injection.build_pod_patch(
        p, pol, cfg, default_rate=1e9, rank=0, **kw))


def test_trainer_access_is_a_boolean_off_by_default() -> None:
    assert parsed(SPEC).trainer_access is False
    assert parsed(ASKS).trainer_access is True
    bad = {**SPEC, "storage": {**SPEC["storage"], "trainerAccess": "yes"}}
    with pytest.raises(InvalidInput, match=r"spec\.storage\.trainerAccess"):
        parsed(bad)


@pytest.mark.parametrize("reader", [False, True])
def test_asked_every_application_container_gets_the_namespaces_token(reader: bool) -> None:
    out = inject(pod(), parsed(ASKS), reader=reader)
    found = by_name(out)
    for name in APPLICATION:
        assert token_mounts(found[name]) == [tenant_identity.mount()], name
        env = env_of(found[name])
        assert {k: env[k] for k in IDENTITY_ENV & set(env)} == {
            "AWS_ROLE_ARN": TENANT.role_arn,
            "AWS_WEB_IDENTITY_TOKEN_FILE": f"{tenant_identity.TOKEN_DIR}/token",
            "AWS_ROLE_SESSION_NAME": "ckptdrain-ml", "AWS_STS_REGIONAL_ENDPOINTS": "regional"}
    # One volume, the one restore and the agent use; still none for ours
    # that never reach the store.
    assert [v["name"] for v in out["spec"]["volumes"]].count(tenant_identity.VOLUME) == 1
    if not reader:
        for name in (injection.PREPARE, "ckptdrain-peer"):
            assert token_mounts(found[name]) == [] and not IDENTITY_ENV & set(env_of(found[name]))
    # An identity webhook after ours leaves the trainer's alone too.
    skipped = out["metadata"]["annotations"][SKIP_ANNOTATION].split(",")
    assert set(APPLICATION) <= set(skipped)


def test_not_asked_the_application_containers_get_nothing() -> None:
    out = inject(pod(), parsed(SPEC))
    for name in APPLICATION:
        assert token_mounts(by_name(out)[name]) == []
        assert not IDENTITY_ENV & set(env_of(by_name(out)[name]))
    assert not set(APPLICATION) & set(out["metadata"]["annotations"][SKIP_ANNOTATION].split(","))


def test_asking_changes_nothing_where_there_is_no_mapping() -> None:
    """Unmapped namespace, a Secret, a gs:// store: the trainer has what its
    pod gives it, exactly as without the field."""
    with_secret = {"uri": "s3://bucket/runs", "credentialsSecretRef": {"name": "creds"}}
    cases = [(parsed(ASKS, "other"), parsed(SPEC, "other"), pod("other")),
             (parsed({**ASKS, "storage": {**with_secret, "trainerAccess": True}}),
              parsed({**SPEC, "storage": with_secret}), pod()),
             (parsed({**ASKS, "storage": {"uri": "gs://bucket/runs", "trainerAccess": True}}),
              parsed({**SPEC, "storage": {"uri": "gs://bucket/runs"}}), pod())]
    for asked, plain, given in cases:
        assert injection.build_pod_patch(given, asked, CFG, default_rate=1e9, rank=0) == \
            injection.build_pod_patch(given, plain, CFG, default_rate=1e9, rank=0)


def test_a_container_with_an_identity_of_its_own_keeps_it() -> None:
    given = with_trainer_identity(pod())
    given["spec"]["containers"][1]["env"] = list(POD_IDENTITY_ENV)
    given["spec"]["containers"][1]["volumeMounts"] = []
    out = by_name(inject(given, parsed(ASKS)))
    assert env_of(out["trainer"])["AWS_ROLE_ARN"] == TRAINER_ROLE
    assert env_of(out["trainer"])["AWS_WEB_IDENTITY_TOKEN_FILE"].startswith(
        "/var/run/secrets/eks.amazonaws.com/")
    assert not {"AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"} & set(env_of(out["logger"]))
    for name in APPLICATION:
        assert token_mounts(out[name]) == []
    for name in OURS_TO_STORE:  # restore and the agent hold the namespace's still
        assert env_of(out[name])["AWS_ROLE_ARN"] == TENANT.role_arn


def _admit(body: dict[str, Any], spec: dict[str, Any], namespace: str = "ml",
           cfg: config.OperatorConfig = CFG) -> tuple[list[dict[str, Any]], list[str]]:
    """One writer (no workload to find a rank in), no peer tier."""
    one = {**spec, "writers": 1}
    one.pop("peerTier", None)
    body = copy.deepcopy(body)
    body["metadata"]["namespace"] = namespace
    body["spec"]["terminationGracePeriodSeconds"] = 3600
    warnings: list[str] = []
    candidates = [{"metadata": {"name": "llama", "namespace": namespace, "uid": "u"},
                   "spec": one}]
    ops = asyncio.run(admission.admit_pod(body, namespace, cfg, warnings,
                                          logging.getLogger("t"), candidates,
                                          lambda name: lambda rank: [], every=candidates))
    return ops, warnings


def test_admission_says_the_trainer_gets_no_identity_unless_asked() -> None:
    ops, warnings = _admit(pod(), SPEC)
    assert ops
    assert warnings.count(f"ckptdrain: policy llama: {NO_IDENTITY}") == 1
    assert not [w for w in warnings if "store identity" in w and NO_IDENTITY not in w]
    assert not [w for w in _admit(pod(), ASKS)[1] if "store identity" in w]
    # Unmapped: the trainer has its ServiceAccount's, nothing to say.
    assert not [w for w in _admit(pod("other"), SPEC, "other")[1] if "store identity" in w]


@pytest.mark.parametrize("spec", [SPEC, ASKS], ids=["not-asked", "asked"])
def test_admission_warns_of_a_trainer_holding_its_own_role(spec: dict[str, Any]) -> None:
    given = with_trainer_identity(pod())
    given["spec"]["containers"][1]["env"] = list(POD_IDENTITY_ENV)
    warnings = [w for w in _admit(given, spec)[1] if "store identity" in w]
    assert warnings == [
        "ckptdrain: container trainer holds its own store identity (AWS_ROLE_ARN), not "
        "namespace ml's: the mapping keeps restore and the agent to the tenant's prefix, "
        "not this container",
        "ckptdrain: container logger holds its own store identity "
        "(AWS_CONTAINER_CREDENTIALS_FULL_URI), not namespace ml's: the mapping keeps "
        "restore and the agent to the tenant's prefix, not this container"]


def test_admission_warns_when_a_webhook_after_ours_gives_the_trainer_a_role() -> None:
    for spec in (SPEC, ASKS):
        injected = inject(pod(), parsed(spec))
        # Ours in the trainer is no identity of its own: nothing to say.
        assert not [w for w in _admit(injected, spec)[1] if "store identity" in w]
        later = copy.deepcopy(injected)
        later["spec"]["containers"][1]["env"] = [
            *later["spec"]["containers"][1].get("env", []), *POD_IDENTITY_ENV]
        later["spec"]["containers"][1]["env"] = [
            e for e in later["spec"]["containers"][1]["env"]
            if e["name"] not in ("AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")]
        warnings = [w for w in _admit(later, spec)[1] if "store identity" in w]
        assert warnings == [w for w in warnings if w.startswith("ckptdrain: container logger")]
        assert len(warnings) == 1


@pytest.mark.parametrize("theirs", [
    {"name": tenant_identity.VOLUME, "emptyDir": {}},
    {"name": tenant_identity.VOLUME, "projected": {"sources": [{"serviceAccountToken": {
        "audience": "sts.amazonaws.com", "expirationSeconds": 1800, "path": "token"}}]}},
    {"name": tenant_identity.VOLUME, "projected": {"sources": [
        {"serviceAccountToken": {"audience": TENANT.audience, "expirationSeconds": 1800,
                                 "path": "token"}},
        {"configMap": {"name": "extra"}}]}},
], ids=["emptydir", "other-audience", "more-sources"])
def test_a_pod_volume_named_like_the_token_but_not_it_is_refused(theirs: dict[str, Any]) -> None:
    given = pod()
    given["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}, theirs]
    with pytest.raises(admission.Refused) as refused:
        _admit(given, SPEC)
    assert refused.value.code == 422
    assert f"spec.volumes[1]: the volume name {tenant_identity.VOLUME}" in str(refused.value)
    assert "rename the pod's volume" in str(refused.value)
    # Unmapped, the name is not ours to need: the pod is injected.
    assert _admit(given, SPEC, "other")[0]
    assert _admit(given, SPEC, cfg=BASE)[0]


def test_a_pod_volume_exactly_the_token_is_used() -> None:
    """The apiserver fills in defaultMode before admission: still the same."""
    ours = tenant_identity.volume(TENANT)
    ours["projected"]["defaultMode"] = 420
    given = pod()
    given["spec"]["volumes"] = [ours]
    ops, _ = _admit(given, SPEC)
    out = jsonpatch.apply_patch(copy.deepcopy(given), ops)
    assert [v["name"] for v in out["spec"]["volumes"]].count(tenant_identity.VOLUME) == 1
    assert token_mounts(by_name(out)[injection.RESTORE])
