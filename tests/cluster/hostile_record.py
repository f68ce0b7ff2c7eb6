"""The hostile-tenant suite's ledger (test_hostile_tenant.py): each path
tenant B tries towards tenant A's data, what refused it, where the refusal
can be read afterwards, and whether anything of A's reached B. One list of
attempts with what each is expected to meet, read by the suite (which
records what it met) and by the docs test that keeps docs/security.md's
table to it."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOCAL_OUTSIDE = "policy localTier.path `/`, outside the allowed root"
LOCAL_CLIMB = "policy localTier.path climbing with .. into A's node directory"
LOCAL_A_DIR = "policy localTier.path `<root>/nvme/<A's namespace>`, A's node directory itself"
LOCAL_ROOT = "policy localTier.path `<root>`, above A's node directory"
LOCAL_NESTED = "policy localTier.path inside or around A's node directory (hostPath mode)"
WRITE_IN_A = "B's token writes a policy in A's namespace"
READ_SECRETS = "B's token reads A's Secrets"
READ_CONFIGMAPS = "B's token reads A's ConfigMaps"
READ_POLICIES = "B's token reads A's CheckpointPolicies"
READ_CHECKPOINTS = "B's token reads A's Checkpoints"
SECRET_OF_A = "policy credentialsSecretRef naming A's namespace, sent unvalidated"
PREFIX_OF_A = "policy storage.uri under A's prefix, naming no class (the default has {namespace})"
PREFIX_OTHER_CLASS = "policy storage.uri under A's prefix, naming a class with no store prefixes"
ENDPOINT = "policy storage.endpoint redirected to a host the platform did not list"
STORE_LIST = "B's agent keys (a per-tenant store user) list A's prefix"
STORE_GET = "B's agent keys (a per-tenant store user) read A's object"
STORE_PUT = "B's agent keys (a per-tenant store user) overwrite A's object"
STORE_DELETE = "B's agent keys (a per-tenant store user) delete A's object"
STORE_MULTIPART = "B's agent keys (a per-tenant store user) start a multipart upload in A's prefix"
STORE_UPLOADS = ("B's agent keys (a per-tenant store user) list the unfinished multipart "
                 "uploads in A's prefix")
STORE_ABORT = "B's agent keys (a per-tenant store user) abort A's unfinished multipart upload"
CSI_POLICY_OF_A = "CSI volume of B's pod naming A's policy"
CSI_OWN_SAME_NAME = "CSI volume of B's own policy named like A's"
CSI_NAMESPACE_OF_A = "CSI volume of B's pod with A's namespace in its attributes"
CSI_FORGED_POD = "CSI volume with pod.namespace A's, the pod UID not the target path's"
CSI_RECREATED = "CSI volume of a same-name policy recreated over the old UID's data"
EXEC_IN_A = "B's token runs a command in A's pod (pods/exec)"
TOKEN_OF_A = "B's token asks for a token of A's ServiceAccount (serviceaccounts/token)"
PEER_CERT = "B's peer certificate asking A's peer server for A's held copies"
PEER_FORGED_ID = "a certificate from B's own CA naming A's policy id, to A's peer server"
PEER_SAME_NAME = ("B's peer-tier policy named like A's: the peer Secret, CA and ConfigMap "
                  "the operator makes for it")
PEER_NAMED = ("B's peer-tier policy naming A's peer Secret, ConfigMap and namespace, "
              "sent unvalidated")
PEER_POD = "B's running writer of its policy named like A's: paired into A's peers ConfigMap"
PEER_READ = "B's token reads A's peer Secret, and A's peer CA in the operator's namespace"
FORGED_REVIEW = "AdmissionReview for a pod in A's namespace, posted straight to the webhook"

#: The platform's own records (docs/audit.md): the apiserver's audit log
#: under the policy that page shows, and the store's audit entries.
AUDIT_RBAC = "apiserver audit log: 403 to B's ServiceAccount"
AUDIT_DENIED = "apiserver audit log: the webhook's denial to B's ServiceAccount"
AUDIT_INVALID = "apiserver audit log: 422 Invalid to B's ServiceAccount"
OPERATOR_LOG = "operator log (names A's policy in the way)"
DRIVER_LOG = "CSI driver log"
PEER_LOG = "peer server log: CERTIFICATE_VERIFY_FAILED"
ADMITTED = "nothing to log: admitted"
STORE_AUDIT = "store audit log (MinIO's audit webhook): 403 to B's access key"
STORE_REFUSED = "store: AccessDenied to B's user (the platform's per-tenant policy)"


def logged_in(*places: str) -> str:
    """The places a refusal was found logged, in the order given ("" for
    one where it was not)."""
    return "; ".join(p for p in places if p)


#: Every attempt the suite makes, in the order it makes them, with what it
#: is expected to meet: (refused by, logged). "" refused by: nothing
#: refuses it. docs/security.md lists the same, one table row each
#: (tests/docs/test_security_page.py); the suite asserts it met these.
EXPECTED: dict[str, tuple[str, str]] = {
    LOCAL_OUTSIDE: ("policy admission: spec.localTier.path (outside the allowed root)",
                    AUDIT_DENIED),
    LOCAL_CLIMB: ("CRD schema: validation rule on spec.localTier.path", AUDIT_INVALID),
    LOCAL_A_DIR: ("policy admission: spec.localTier.path (node directories nest)",
                  logged_in(OPERATOR_LOG, AUDIT_DENIED)),
    LOCAL_ROOT: ("", ADMITTED),
    LOCAL_NESTED: ("policy admission: spec.localTier.path (node directories nest); pod "
                   "admission, for a policy stored past it", logged_in(OPERATOR_LOG, AUDIT_DENIED)),
    WRITE_IN_A: ("RBAC (apiserver)", AUDIT_RBAC),
    READ_SECRETS: ("RBAC (apiserver)", AUDIT_RBAC),
    READ_CONFIGMAPS: ("RBAC (apiserver)", AUDIT_RBAC),
    READ_POLICIES: ("RBAC (apiserver)", AUDIT_RBAC),
    READ_CHECKPOINTS: ("RBAC (apiserver)", AUDIT_RBAC),
    SECRET_OF_A: ("CRD schema: field does not exist (pruned)", ADMITTED),
    PREFIX_OF_A: ("policy admission: the default class's stores", AUDIT_DENIED),
    PREFIX_OTHER_CLASS: ("", ADMITTED),
    ENDPOINT: ("policy admission: CKPTDRAIN_AMBIENT_ENDPOINTS", AUDIT_DENIED),
    **{name: (STORE_REFUSED, STORE_AUDIT)
       for name in (STORE_LIST, STORE_GET, STORE_PUT, STORE_DELETE, STORE_MULTIPART,
                    STORE_UPLOADS, STORE_ABORT)},
    CSI_POLICY_OF_A: ("CSI driver: NOT_FOUND", DRIVER_LOG),
    CSI_OWN_SAME_NAME: ("CSI driver: B's policy UID, a directory of its own", ADMITTED),
    CSI_NAMESPACE_OF_A: ("CSI driver: INVALID_ARGUMENT", DRIVER_LOG),
    CSI_FORGED_POD: ("CSI driver: INVALID_ARGUMENT", DRIVER_LOG),
    CSI_RECREATED: ("CSI driver owner marker: PERMISSION_DENIED", DRIVER_LOG),
    EXEC_IN_A: ("RBAC (apiserver)", AUDIT_RBAC),
    TOKEN_OF_A: ("RBAC (apiserver)", AUDIT_RBAC),
    PEER_CERT: ("peer server: mutual TLS, the policy's own CA", PEER_LOG),
    PEER_FORGED_ID: ("peer server: mutual TLS, the policy's own CA", PEER_LOG),
    PEER_SAME_NAME: ("the operator: B's own namespace, and a CA by B's policy UID", ADMITTED),
    PEER_NAMED: ("CRD schema: fields do not exist (pruned)", ADMITTED),
    PEER_POD: ("the operator: pods are paired within their own namespace's policy", ADMITTED),
    PEER_READ: ("RBAC (apiserver)", AUDIT_RBAC),
    FORGED_REVIEW: ("", ""),
}
ATTEMPTS: tuple[str, ...] = tuple(EXPECTED)

#: Attempts nothing refuses, each for a reason docs/security.md gives under
#: "Open" or "Admitted, and why that reaches nothing of A's". The suite
#: asserts each as it stands (leaked as measured), so that the run fails
#: once one is refused and this list and the page must change.
OPEN: dict[str, str] = {
    PREFIX_OTHER_CLASS: "a class with no stores checks no prefix: the boundary is the store "
                        "identity B's pods get, which the default install does not scope "
                        "(a per-tenant one refuses B: the STORE_* attempts)",
    FORGED_REVIEW: "the webhook server asks no client certificate: whatever reaches its "
                   "Service gets the injection patch of A's policy (bucket, prefix, endpoint, "
                   "Secret name; no Secret values) and holds a writer rank for 30 s",
}
#: Admitted, and what B gets lies beside A's: not a path to A's data.
BESIDE: dict[str, str] = {
    LOCAL_ROOT: "B's node directory is <root>/<B's namespace>, beside A's <root>/nvme/<A's>",
    SECRET_OF_A: "the namespace is pruned; B's pods reference the Secret of B's namespace",
    CSI_OWN_SAME_NAME: "B's policy has its own UID and starts empty",
    PEER_SAME_NAME: "B's peer objects are in B's namespace, under a CA of B's policy UID",
    PEER_NAMED: "the fields are pruned; the operator makes B's own objects in B's namespace",
    PEER_POD: "B's writer is paired in B's own policy's ConfigMap, never in A's",
}

NOT_RUN = "not run"

#: Where the suite writes the table of its run, when set (docs/security.md
#: shows the command).
TABLE_ENV = "CKPTDRAIN_HOSTILE_TABLE"


@dataclass(frozen=True)
class Attempt:
    name: str
    refused_by: str  # what refused it; "" when nothing did, NOT_RUN when skipped
    logged: str  # where the refusal can be read afterwards
    leaked: int  # files, objects or settings of A's that reached B


def cell(refused_by: str) -> str:
    return refused_by or "NOT REFUSED"


def table(attempts: list[Attempt]) -> str:
    """The markdown table docs/security.md shows, with its totals."""
    rows = ["| attempt | refused by | logged | leaked |", "| --- | --- | --- | --- |"]
    rows += [f"| {a.name} | {cell(a.refused_by)} | {a.logged or '—'} | {a.leaked} |"
             for a in attempts]
    ran = [a for a in attempts if a.refused_by != NOT_RUN]
    refused = sum(1 for a in ran if a.refused_by and a.name not in BESIDE)
    leaked = sum(a.leaked for a in ran)
    rows.append(f"\nattempts: {len(ran)}, refused: {refused}, admitted beside A's: "
                f"{sum(1 for a in ran if a.name in BESIDE)}, open: "
                f"{sum(1 for a in ran if a.name in OPEN)}, leaked: {leaked}, "
                f"not run: {len(attempts) - len(ran)}")
    return "\n".join(rows) + "\n"


def write_table(attempts: list[Attempt]) -> str:
    text = table(attempts)
    target = os.environ.get(TABLE_ENV)
    if target:
        Path(target).write_text(text)
    return text


#: What the suite's run recorded, in its order.
LEDGER: list[Attempt] = []
#: The attempts of the tests whose bodies ran (a skipped test's did not).
RAN: set[str] = set()


def makes(*names: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Marks the attempts a test makes: the ledger expects them once its body runs."""
    def wrap(test: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(test)
        def run(*args: Any, **kwargs: Any) -> None:
            RAN.update(names)
            test(*args, **kwargs)
        run.makes = names  # type: ignore[attr-defined]
        return run
    return wrap


def record(name: str, refused_by: str, logged: str, leaked: int) -> None:
    assert name in ATTEMPTS, name
    LEDGER.append(Attempt(name, refused_by, logged, leaked))


def rows_of_run() -> list[Attempt]:
    """The run's table rows: each attempt as recorded, or NOT_RUN."""
    recorded = {a.name: a for a in LEDGER}
    return [recorded.get(n) or Attempt(n, NOT_RUN, "", 0) for n in ATTEMPTS]


def problems() -> list[str]:
    """What is wrong with the run's record: the attempts of the tests that
    ran missing or out of order, an attempt that met other than EXPECTED,
    or anything leaked by an attempt not OPEN."""
    found = []
    if [a.name for a in LEDGER] != [n for n in ATTEMPTS if n in RAN]:
        found.append("the recorded attempts are not those of the tests that ran, in order")
    for a in LEDGER:
        if (a.refused_by, a.logged) != EXPECTED[a.name]:
            found.append(f"{a.name}: met {(a.refused_by, a.logged)}, expected {EXPECTED[a.name]}")
        if a.leaked and a.name not in OPEN:
            found.append(f"{a.name}: leaked {a.leaked}")
        if not a.refused_by and a.name not in OPEN and a.name not in BESIDE:
            found.append(f"{a.name}: not refused")
    return found


def still_open(name: str, refused: bool) -> None:
    """An attempt OPEN lists is still not refused; once it is, the list and
    docs/security.md must say so."""
    assert not refused, f"{name!r} is refused now: take it out of OPEN and docs/security.md"
