"""Where the hostile-tenant suite (test_hostile_tenant.py) reads the
platform's own records of its refusals of B, as a platform team would
afterwards: the apiserver's audit log, written under docs/audit.md's policy
(support/audit_log.py), and MinIO's audit entries
(support/store_audit.py). Each is found by B's identity (its
ServiceAccount's username, its store access key) and what was refused.

The apiserver writes an event as the request ends (the log backend in
blocking mode), which may be just after B has its answer, and MinIO sends
its entries from a queue: each is waited for, up to the suite's bound on
a record that is coming (cluster_helpers.wait_for), and a record not there
by then is missing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import hostile_record as ledger
from cluster_helpers import wait_for

from support import audit_log
from support.store_audit import AuditReceiver

if TYPE_CHECKING:
    from hostile_tenants import Tenant

#: The message with which the apiserver relays an admission webhook's denial.
WEBHOOK_DENIED = "denied the request"


def username(tenant: Tenant) -> str:
    """B's user as the apiserver names it: its ServiceAccount `trainer`."""
    return f"system:serviceaccount:{tenant.namespace}:trainer"


def _found(what: str, check: Any) -> bool:
    try:
        wait_for(check, what=what)
    except AssertionError:
        return False
    return True


def audited(tenant: Tenant, verb: str, resource: str, namespace: str,
            name: str | None = None, *, subresource: str = "", code: int | None = None,
            reason: str | None = None, says: str = "", decision: str | None = None) -> bool:
    """Whether the apiserver's audit log has B's `verb` on `resource` in
    `namespace` (`name`: that object; `subresource`: its subresource)
    refused: with `code` and `reason` when given, its message saying
    `says`, and the authorizer's `decision` when given."""
    def matches(e: dict[str, Any]) -> bool:
        status, notes = e["responseStatus"], e.get("annotations") or {}
        return (audit_log.refused(e, verb, resource, namespace, name, subresource)
                and (code is None or status["code"] == code)
                and reason in (None, status.get("reason"))
                and says in status.get("message", "")
                and decision in (None, notes.get("authorization.k8s.io/decision")))
    target = "/".join(filter(None, (resource, subresource)))
    return _found(f"the apiserver's audit event of B's {verb} {target} in {namespace} "
                  f"{name or ''} refused", lambda: any(
                      matches(e) for e in audit_log.refusals(tenant.cluster.workdir,
                                                             username(tenant))))


def rbac_refused(tenant: Tenant, verb: str, resource: str, namespace: str,
                 name: str | None = None, subresource: str = "") -> bool:
    """Whether the audit log has RBAC's 403 to B for that request (a
    create's refusal names no object: RBAC answers before the body is read)."""
    return audited(tenant, verb, resource, namespace, name, subresource=subresource,
                   code=403, reason="Forbidden", decision="forbid")


def written_refusal(tenant: Tenant, resource: str, name: str, refused_by: str,
                    namespace: str | None = None) -> str:
    """Where the apiserver's refusal of B's create of `name` (in B's
    namespace unless said) can be read afterwards, as the ledger says it:
    the webhook's denial or the CRD schema's 422 in the audit log; "" when
    it was not refused or its event is missing."""
    where = namespace or tenant.namespace
    if refused_by.startswith(("policy admission", "pod admission")):
        found = audited(tenant, "create", resource, where, name, says=WEBHOOK_DENIED)
        return ledger.AUDIT_DENIED if found else ""
    if refused_by.startswith("CRD schema"):
        found = audited(tenant, "create", resource, where, name, code=422, reason="Invalid")
        return ledger.AUDIT_INVALID if found else ""
    return ""


def store_refused(receiver: AuditReceiver, access_key: str, api: str, bucket: str,
                  prefix: str) -> bool:
    """Whether MinIO's audit entries have its 403 to `access_key`'s `api`
    call on `bucket`, on a key (or a listing's prefix) under `prefix`."""
    def on(entry: dict[str, Any]) -> str:
        return entry["api"].get("object") or (entry.get("requestQuery") or {}).get("prefix", "")
    return _found(f"MinIO's audit entry of B's {api} refused", lambda: any(
        e["api"].get("name") == api and e["api"].get("bucket") == bucket
        and on(e).startswith(prefix) for e in receiver.refusals(access_key)))


def store_calls_seen(receiver: AuditReceiver, access_key: str) -> list[tuple[str, int]]:
    """The calls MinIO audited for `access_key`, (API name, status code): what
    a failure shows, never an entry itself (it carries the request's headers)."""
    return [((e.get("api") or {}).get("name", ""), (e.get("api") or {}).get("statusCode", 0))
            for e in receiver.entries() if e.get("accessKey") == access_key]
