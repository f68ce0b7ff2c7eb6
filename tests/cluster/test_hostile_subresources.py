"""Tenant B's token tries the ways into A's running pods and A's
ServiceAccounts that go through a subresource, not the object itself:
running a command in A's pod (`pods/exec`) and minting a token of A's
ServiceAccount (`serviceaccounts/token`). RBAC refuses each, and each
refusal is in the apiserver's audit log under docs/audit.md's policy (a
rule naming `pods` alone does not match `pods/exec`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import hostile_audit
import pytest
from hostile_tenants import Tenant

from support.apiserver import Cluster

#: A's ServiceAccount, the one whose token B asks for.
A_ACCOUNT = "runner"


@pytest.fixture
def tenant_b(cluster: Cluster, namespace: str) -> Iterator[Tenant]:
    """Tenant B beside tenant A (the `namespace` fixture), A holding a
    ServiceAccount."""
    name = f"b-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("create", "serviceaccount", A_ACCOUNT, "-n", namespace)
    try:
        yield Tenant(cluster, name)
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_b_cannot_exec_in_as_pod_and_the_refusal_is_audited(
        namespace: str, tenant_b: Tenant) -> None:
    # The exec subresource as a client reaches it: a POST naming the command.
    # RBAC answers before the pod is looked up or the stream upgraded.
    path = f"/api/v1/namespaces/{namespace}/pods/trainer-0/exec?command=id&stdout=true"
    made = tenant_b.kubectl("create", "--raw", path, "-f", "-", body={})
    assert made.returncode != 0 and "forbidden" in made.stderr.lower(), made.stderr
    assert hostile_audit.rbac_refused(tenant_b, "create", "pods", namespace, "trainer-0",
                                      subresource="exec"), \
        "B's refused pods/exec not in the apiserver's audit log"


def test_b_cannot_mint_a_token_of_as_serviceaccount_and_the_refusal_is_audited(
        namespace: str, tenant_b: Tenant) -> None:
    made = tenant_b.kubectl("create", "token", A_ACCOUNT, "-n", namespace)
    assert made.returncode != 0 and "forbidden" in made.stderr.lower(), made.stderr
    assert made.stdout == "", "a token of A's ServiceAccount reached B"
    assert hostile_audit.rbac_refused(tenant_b, "create", "serviceaccounts", namespace,
                                      A_ACCOUNT, subresource="token"), \
        "B's refused serviceaccounts/token not in the apiserver's audit log"
