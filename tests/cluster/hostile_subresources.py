"""Tenant B's token tries the ways into A's running pods and A's
ServiceAccounts that go through a subresource, not the object itself:
running a command in A's pod (`pods/exec`) and asking for a token of A's
ServiceAccount (`serviceaccounts/token`). RBAC refuses each, and each
refusal is in the apiserver's audit log under docs/audit.md's policy (a
rule naming `pods` alone does not match `pods/exec`); docs/audit.md's own
command listing one tenant's refusals lists both. Run by
test_hostile_tenant.py, in the ledger's order."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

import hostile_audit
import hostile_record as ledger
from tests.docs import blocks

from support import audit_log
from support.apiserver import Cluster

if TYPE_CHECKING:
    from hostile_tenants import Tenant

#: A's pod and ServiceAccount, by the names B tries. RBAC answers before
#: the pod is looked up, so it need not exist.
A_POD, A_ACCOUNT = "trainer-0", "runner"


@ledger.makes(ledger.EXEC_IN_A, ledger.TOKEN_OF_A)
def test_bs_exec_and_token_in_a_refused(
        cluster: Cluster, namespace: str, tenant_b: Tenant) -> None:
    cluster.kubectl("create", "serviceaccount", A_ACCOUNT, "-n", namespace)
    # The exec subresource as a client reaches it: a POST naming the command.
    exec_path = f"/api/v1/namespaces/{namespace}/pods/{A_POD}/exec?command=id&stdout=true"
    attempts = ((ledger.EXEC_IN_A, ("create", "--raw", exec_path, "-f", "-"), "pods", A_POD,
                 "exec"),
                (ledger.TOKEN_OF_A, ("create", "token", A_ACCOUNT, "-n", namespace),
                 "serviceaccounts", A_ACCOUNT, "token"))
    for name, args, resource, object_name, subresource in attempts:
        made = tenant_b.kubectl(*args, body={} if "--raw" in args else None)
        refused = made.returncode != 0 and "forbidden" in made.stderr.lower()
        audited = hostile_audit.rbac_refused(tenant_b, "create", resource, namespace,
                                             object_name, subresource)
        ledger.record(name, "RBAC (apiserver)" if refused else "",
                      ledger.AUDIT_RBAC if audited else "", int(made.returncode == 0))
        assert refused and made.stdout == "", (made.stdout[:200], made.stderr)
        assert audited, f"B's refused {resource}/{subresource} not in the apiserver's audit log"
    listed = _the_pages_listing(cluster, tenant_b.namespace)
    for resource, object_name in (("pods", A_POD), ("serviceaccounts", A_ACCOUNT)):
        assert f'"{resource}","{namespace}","{object_name}",403]' in listed, (
            f"docs/audit.md's listing of B's refusals lacks its {resource} refusal")


def _the_pages_listing(cluster: Cluster, tenant_namespace: str) -> str:
    """docs/audit.md's command listing one tenant's refused requests, as
    written, for `tenant_namespace` (the page says team-b) on this
    apiserver's audit log (the page says a control-plane node's path)."""
    block = next(b for b in blocks.parse(audit_log.PAGE)
                 if b.kind == "cluster" and "jq -c" in b.text)
    assert '"system:serviceaccount:team-b:"' in block.text
    assert " /var/log/kubernetes/audit.log" in block.text
    script = block.text.replace('"system:serviceaccount:team-b:"',
                                f'"system:serviceaccount:{tenant_namespace}:"').replace(
        " /var/log/kubernetes/audit.log", f" {cluster.workdir / audit_log.LOG_NAME}")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
