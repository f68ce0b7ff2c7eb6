"""One store identity per tenant namespace, through the real apiserver's
admission chain: the operator runs with CKPTDRAIN_AGENT_IDENTITIES mapping
the test's namespace to a role; the apiserver takes the pod with the
projected token volume (its audience and lifetime as configured), and only
restore and the agent hold it, whatever identity the trainer was given and
whichever order a platform identity webhook runs in. A namespace not mapped
is injected as before."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import INJECT, POLICIES, get, pod, policy, wait_for
from operator_process import OperatorProcess

# The identity webhook of tests/cluster/test_cloud_identity_order.py, served
# and registered the same way (fixtures used by name below).
from test_cloud_identity_order import (  # noqa: F401
    ORDER_LABEL,
    TOKEN_DIR,
    _register,
    platform_webhook,
    reinvoked_like_the_chart,
)

from ckptdrain.operator.admission import injection, tenant_identity
from support import apiserver

TENANT_ROLE = "arn:aws:iam::111122223333:role/ckpt-tenant"
TRAINER_ROLE = "arn:aws:iam::999999999999:role/shared"
AUDIENCE = "ckptdrain.io/store"
ACCOUNT = "ckptdrain-agent"
OURS = (injection.RESTORE, injection.AGENT)
IDENTITY_ENV = ("AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_SESSION_NAME",
                "AWS_STS_REGIONAL_ENDPOINTS")


@pytest.fixture
def mapped(cluster: apiserver.Cluster, operator: OperatorProcess, namespace: str,
           tmp_path: Path) -> Iterator[str]:
    """The session operator swapped for one mapping `namespace` to
    TENANT_ROLE; returns the namespace."""
    operator.stop()
    identities = {namespace: {"awsRoleArn": TENANT_ROLE, "audience": AUDIENCE,
                              "expirationSeconds": 1200}}
    swapped = OperatorProcess(cluster, tmp_path,
                              CKPTDRAIN_AGENT_IDENTITIES=json.dumps(identities))
    try:
        swapped.start()
        yield namespace
    finally:
        swapped.stop()
        operator.start()


def _trainer_with_identity(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A pod whose trainer already holds the platform's shared role, as EKS's
    webhook run before ours leaves it."""
    token = {"serviceAccountToken": {"audience": "sts.amazonaws.com",
                                     "expirationSeconds": 86400, "path": "token"}}
    body = pod(name, {**labels, **INJECT}, terminationGracePeriodSeconds=600,
               serviceAccountName=ACCOUNT,
               volumes=[{"name": "aws-iam-token", "projected": {"sources": [token]}}])
    trainer = body["spec"]["containers"][0]
    trainer["env"] = [{"name": "AWS_ROLE_ARN", "value": TRAINER_ROLE},
                      {"name": "AWS_WEB_IDENTITY_TOKEN_FILE", "value": f"{TOKEN_DIR}/token"}]
    trainer["volumeMounts"] = [{"name": "aws-iam-token", "mountPath": TOKEN_DIR,
                                "readOnly": True}]
    return body


def _ready_policy(cluster: apiserver.Cluster, namespace: str, name: str,
                  account: bool = True, **storage: Any) -> None:
    """The policy, sized, and (`account`) the pods' ServiceAccount (a
    projected token needs one; a cluster's ServiceAccount admission plugin,
    off here, names `default` before any webhook runs)."""
    if account:
        cluster.kubectl("create", "serviceaccount", ACCOUNT, "-n", namespace)
    body = policy(name, writers=1, storage={"uri": "s3://ckpt-bucket/runs", **storage})
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))
    wait_for(lambda: (get(cluster, namespace, POLICIES, name).get("status") or {})
             .get("phase"), what=f"policy {name} sized")


def _create(cluster: apiserver.Cluster, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    return _create_warned(cluster, namespace, body)[0]


def _create_warned(cluster: apiserver.Cluster, namespace: str,
                   body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The stored pod, and what kubectl printed of the admission's warnings."""
    made = cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "json",
                           input=json.dumps(body), check=False)
    assert made.returncode == 0, made.stderr
    return get(cluster, namespace, "pod", body["metadata"]["name"]), made.stderr


def _containers(stored: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in stored["spec"]["initContainers"] + stored["spec"]["containers"]}


def _env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in c.get("env") or []}


def _token_volume_checked(stored: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod's containers by name, once its projected token volume is the
    one admission adds for a store identity (AUDIENCE, 1200 s)."""
    volume = next(v for v in stored["spec"]["volumes"] if v["name"] == tenant_identity.VOLUME)
    assert volume["projected"]["sources"] == [{"serviceAccountToken": {
        "audience": AUDIENCE, "expirationSeconds": 1200, "path": "token"}}]
    return _containers(stored)


def _assert_tenant_only_in_ours(stored: dict[str, Any], namespace: str) -> None:
    found = _token_volume_checked(stored)
    for name in OURS:
        env = _env(found[name])
        assert {k: env.get(k) for k in IDENTITY_ENV} == {
            "AWS_ROLE_ARN": TENANT_ROLE,
            "AWS_WEB_IDENTITY_TOKEN_FILE": f"{tenant_identity.TOKEN_DIR}/token",
            "AWS_ROLE_SESSION_NAME": f"ckptdrain-{namespace}",
            "AWS_STS_REGIONAL_ENDPOINTS": "regional"}, name
        assert [e["name"] for e in found[name]["env"]].count("AWS_ROLE_ARN") == 1, name
        mounts = {m["name"]: m for m in found[name]["volumeMounts"]}
        assert mounts[tenant_identity.VOLUME] == {
            "name": tenant_identity.VOLUME, "mountPath": tenant_identity.TOKEN_DIR,
            "readOnly": True}, name
        assert "aws-iam-token" not in mounts, name  # nothing of the trainer's
    for name, c in found.items():
        if name in OURS:
            continue
        assert tenant_identity.VOLUME not in {m["name"] for m in c.get("volumeMounts") or []}
        assert _env(c).get("AWS_ROLE_ARN") in (None, TRAINER_ROLE), name
    # The trainer keeps the platform's role: it never sees the tenant's.
    assert _env(found["trainer"])["AWS_ROLE_ARN"] == TRAINER_ROLE
    assert found[injection.AGENT]["restartPolicy"] == "Always"


def test_the_apiserver_takes_the_tenant_token_held_by_our_containers_only(
        cluster: apiserver.Cluster, mapped: str) -> None:
    _ready_policy(cluster, mapped, "tenant")
    stored = _create(cluster, mapped, _trainer_with_identity("w", {"app": "tenant"}))
    _assert_tenant_only_in_ours(stored, mapped)
    skipped = stored["metadata"]["annotations"]["eks.amazonaws.com/skip-containers"]
    assert set(OURS) <= set(skipped.split(","))

    # The same pod in a namespace the platform did not map: as before, the
    # trainer's identity is carried into restore and the agent.
    other = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", other)
    try:
        _ready_policy(cluster, other, "tenant")
        plain = _create(cluster, other, _trainer_with_identity("w", {"app": "tenant"}))
        assert tenant_identity.VOLUME not in {v["name"] for v in plain["spec"]["volumes"]}
        for name in OURS:
            assert _env(_containers(plain)[name])["AWS_ROLE_ARN"] == TRAINER_ROLE, name
    finally:
        cluster.kubectl("delete", "-n", other, f"pods,{POLICIES}", "--all",
                        "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)


def test_the_trainer_holds_the_tenant_token_only_where_its_policy_asks(
        cluster: apiserver.Cluster, mapped: str) -> None:
    """spec.storage.trainerAccess: the trainer mounts the same token and
    gets the same variables; without it, admission says the trainer has no
    store identity, and it says so of a trainer holding a role of its own."""
    _ready_policy(cluster, mapped, "asks", trainerAccess=True)
    _ready_policy(cluster, mapped, "tenant", account=False)
    stored, warned = _create_warned(cluster, mapped, pod(
        "a", {"app": "asks", **INJECT}, terminationGracePeriodSeconds=600,
        serviceAccountName=ACCOUNT))
    trainer = _containers(stored)["trainer"]
    assert {k: _env(trainer).get(k) for k in IDENTITY_ENV} == {
        "AWS_ROLE_ARN": TENANT_ROLE,
        "AWS_WEB_IDENTITY_TOKEN_FILE": f"{tenant_identity.TOKEN_DIR}/token",
        "AWS_ROLE_SESSION_NAME": f"ckptdrain-{mapped}", "AWS_STS_REGIONAL_ENDPOINTS": "regional"}
    assert {"name": tenant_identity.VOLUME, "mountPath": tenant_identity.TOKEN_DIR,
            "readOnly": True} in trainer["volumeMounts"]
    assert "store identity" not in warned

    plain, warned = _create_warned(cluster, mapped, pod(
        "p", {"app": "tenant", **INJECT}, terminationGracePeriodSeconds=600,
        serviceAccountName=ACCOUNT))
    assert "AWS_ROLE_ARN" not in _env(_containers(plain)["trainer"])
    assert "the trainer gets no store identity" in warned
    assert "spec.storage.trainerAccess" in warned
    _, warned = _create_warned(cluster, mapped, _trainer_with_identity("o", {"app": "tenant"}))
    assert "container trainer holds its own store identity (AWS_ROLE_ARN)" in warned
    assert "the trainer gets no store identity" not in warned


def test_a_pod_volume_named_like_the_token_is_refused(
        cluster: apiserver.Cluster, mapped: str) -> None:
    _ready_policy(cluster, mapped, "tenant")
    body = pod("w", {"app": "tenant", **INJECT}, terminationGracePeriodSeconds=600,
               serviceAccountName=ACCOUNT,
               volumes=[{"name": tenant_identity.VOLUME, "emptyDir": {}}])
    made = cluster.kubectl("create", "-n", mapped, "-f", "-", input=json.dumps(body),
                           check=False)
    assert made.returncode != 0
    assert f"spec.volumes[0]: the volume name {tenant_identity.VOLUME}" in made.stderr


@pytest.mark.parametrize("flavour", ["current", "old"])
def test_an_identity_webhook_after_ours_does_not_reach_our_containers(
        cluster: apiserver.Cluster, mapped: str, platform_webhook: tuple[str, str],  # noqa: F811
        reinvoked_like_the_chart: Callable[[], None], flavour: str) -> None:  # noqa: F811
    """Run after ours, EKS's webhook (current: every container the pod's
    skip annotation does not name; old: the application containers, then
    ours is called again) gives the shared role to the trainer only."""
    name = "zzz-pod-identity-webhook"
    url, ca_bundle = platform_webhook
    _register(cluster, name, url, ca_bundle, mapped, flavour)
    try:
        _ready_policy(cluster, mapped, "tenant")
        reinvoked_like_the_chart()
        stored = _create(cluster, mapped, pod(
            "w", {"app": "tenant", ORDER_LABEL: name, **INJECT},
            terminationGracePeriodSeconds=600, serviceAccountName=ACCOUNT))
        found = _containers(stored)
        assert "AWS_ROLE_ARN" in _env(found["trainer"])  # the webhook did run
        for ours in OURS:
            env = _env(found[ours])
            assert env["AWS_ROLE_ARN"] == TENANT_ROLE, ours
            assert TOKEN_DIR not in {m["mountPath"] for m in found[ours]["volumeMounts"]}
        assert found[injection.AGENT]["restartPolicy"] == "Always"
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", name, check=False)
