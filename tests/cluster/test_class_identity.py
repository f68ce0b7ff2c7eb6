"""A CheckpointClass's store identity and ambient endpoints through the real
operator, webhooks and apiserver: a pod of a class whose spec.identity has
`{namespace}` in its role gets that namespace's role in restore and the
agent, over the chart's mapping of the same namespace
(CKPTDRAIN_AGENT_IDENTITIES); a policy without a credentials Secret is
admitted at a store whose entry vouches for its endpoint
(stores[].ambientIdentity) and refused, naming the field, at the same
endpoint under an entry that does not; and a stored policy turns Invalid,
naming the field, when its class's store stops vouching (the class still
takes it), and back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cluster_helpers import INJECT, POLICIES, get, pod, policy, wait_for
from test_checkpoint_classes import ROOT, checkpoint_class

# The operator mapping the test's namespace to TENANT_ROLE, as the chart's
# agent.identities would (used by name below).
from test_tenant_identity_pods import (  # noqa: F401
    ACCOUNT,
    AUDIENCE,
    OURS,
    TENANT_ROLE,
    _create,
    _env,
    _token_volume_checked,
    mapped,
)

from ckptdrain.contract.env import Env
from ckptdrain.operator.admission import tenant_identity
from support import apiserver

MINIO = "https://minio.storage.svc.cluster.local:9000"
PER_NAMESPACE = "arn:aws:iam::111122223333:role/ckpt-{namespace}"


def _classed_policy(name: str, uri: str) -> dict[str, Any]:
    """A policy of class `per-namespace`, without a credentials Secret: its
    pods reach the store with the identity they are given."""
    return policy(name, checkpointClassName="per-namespace", writers=1,
                  localTier={"path": f"{ROOT}/{name}"}, storage={"uri": uri})


def test_a_class_gives_each_namespace_its_role_and_vouches_for_its_store(
        cluster: apiserver.Cluster, mapped: str,  # noqa: F811
        classes: Callable[..., None], apply: Callable[..., Any]) -> None:
    namespace = mapped
    classes(checkpoint_class("per-namespace", identity={
        "awsRoleArn": PER_NAMESPACE, "audience": AUDIENCE, "expirationSeconds": 1200},
        stores=[{"uriPrefix": "s3://ckpt-bucket/{namespace}", "endpoint": MINIO,
                 "ambientIdentity": True},
                {"uriPrefix": "s3://ckpt-other/{namespace}", "endpoint": MINIO}]))

    # Without ambientIdentity on its entry, the same endpoint is refused.
    refused = apply(_classed_policy("unvouched", f"s3://ckpt-other/{namespace}/runs"),
                    check=False)
    assert refused.returncode != 0
    assert "spec.storage.endpoint" in refused.stderr, refused.stderr
    assert "spec.stores[].ambientIdentity" in refused.stderr, refused.stderr

    # Under the entry that vouches for it: admitted.
    admitted = apply(_classed_policy("vouched", f"s3://ckpt-bucket/{namespace}/runs"),
                     check=False)
    assert admitted.returncode == 0, admitted.stderr
    wait_for(lambda: (get(cluster, namespace, POLICIES, "vouched").get("status") or {})
             .get("phase") not in (None, "Invalid"), what="policy vouched sized")

    cluster.kubectl("create", "serviceaccount", ACCOUNT, "-n", namespace)
    stored = _create(cluster, namespace, pod("w", {"app": "vouched", **INJECT},
                                             terminationGracePeriodSeconds=600,
                                             serviceAccountName=ACCOUNT))
    found = _token_volume_checked(stored)
    for name in OURS:
        env = _env(found[name])
        # The class's role for this namespace, not the chart's TENANT_ROLE.
        assert env["AWS_ROLE_ARN"] == f"arn:aws:iam::111122223333:role/ckpt-{namespace}", name
        assert env["AWS_ROLE_ARN"] != TENANT_ROLE
        assert env["AWS_WEB_IDENTITY_TOKEN_FILE"] == f"{tenant_identity.TOKEN_DIR}/token"
        assert env[Env.S3_ENDPOINT] == MINIO, name  # the class's store's endpoint
    assert "AWS_ROLE_ARN" not in _env(found["trainer"])


def _phase(cluster: apiserver.Cluster, namespace: str, name: str) -> tuple[str, str]:
    status = get(cluster, namespace, POLICIES, name).get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
    return status.get("phase") or "", ready.get("message") or ""


def test_a_store_that_stops_vouching_turns_its_stored_policy_invalid_and_back(
        cluster: apiserver.Cluster, namespace: str,
        classes: Callable[..., None], apply: Callable[..., Any]) -> None:
    def toggled(ambient: bool) -> dict[str, Any]:
        return checkpoint_class("per-namespace", stores=[{
            "uriPrefix": "s3://ckpt-bucket/{namespace}", "endpoint": MINIO,
            "ambientIdentity": ambient}])

    classes(toggled(True))
    apply(_classed_policy("p", f"s3://ckpt-bucket/{namespace}/runs"))
    wait_for(lambda: _phase(cluster, namespace, "p")[0] not in ("", "Invalid"),
             what="policy p sized")

    # The class still takes the policy; its spec without a Secret is now refused.
    classes(toggled(False))
    _, message = wait_for(lambda: (lambda s: s if s[0] == "Invalid" else None)(
        _phase(cluster, namespace, "p")), timeout_s=20, what="policy p Invalid")
    assert "spec.storage.endpoint" in message and "spec.stores[].ambientIdentity" in message

    classes(toggled(True))
    wait_for(lambda: _phase(cluster, namespace, "p")[0] not in ("", "Invalid"), timeout_s=20,
             what="policy p usable again")
