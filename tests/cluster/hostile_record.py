"""The hostile-tenant suite's ledger (test_hostile_tenant.py): each path
tenant B tries towards tenant A's data, what refused it, where the refusal
was logged, and whether anything of A's reached B. One list of attempts,
read by the suite and by the docs test that keeps docs/security.md's table
to it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

LOCAL_ROOT = "policy localTier.path at the filesystem root, above every namespace's directory"
LOCAL_CLIMB = "policy localTier.path climbing with .. into A's node directory"
LOCAL_NESTED = "policy localTier.path inside or around A's node directory (hostPath mode)"
WRITE_IN_A = "B's token writes a policy in A's namespace"
READ_SECRETS = "B's token reads A's Secrets"
READ_CONFIGMAPS = "B's token reads A's ConfigMaps"
READ_POLICIES = "B's token reads A's CheckpointPolicies"
READ_CHECKPOINTS = "B's token reads A's Checkpoints"
SECRET_OF_A = "policy credentialsSecretRef naming A's namespace"
PREFIX_OF_A = "policy storage.uri under A's prefix of a {namespace} class"
ENDPOINT = "policy storage.endpoint redirected to a host the platform did not list"
CSI_POLICY_OF_A = "CSI volume of B's pod naming A's policy"
CSI_NAMESPACE_OF_A = "CSI volume of B's pod with A's namespace in its attributes"
CSI_RECREATED = "CSI volume of a same-name policy recreated over the old UID's data"
PEER_CERT = "B's peer certificate asking A's peer server for A's held copies"
FORGED_REVIEW = "AdmissionReview for a pod in A's namespace, posted straight to the webhook"

#: Every attempt the suite makes, in the order it makes them. docs/security.md
#: lists the same, one table row each (tests/docs/test_security_page.py).
ATTEMPTS: tuple[str, ...] = (
    LOCAL_ROOT, LOCAL_CLIMB, LOCAL_NESTED, WRITE_IN_A, READ_SECRETS, READ_CONFIGMAPS,
    READ_POLICIES, READ_CHECKPOINTS, SECRET_OF_A, PREFIX_OF_A, ENDPOINT, CSI_POLICY_OF_A,
    CSI_NAMESPACE_OF_A, CSI_RECREATED, PEER_CERT, FORGED_REVIEW,
)

#: Attempts that are not refused today, and why: their tests are strict
#: xfails that pass (and so fail the run) once the product refuses them,
#: and docs/security.md lists them as open.
OPEN: dict[str, str] = {
    FORGED_REVIEW: "the webhook server asks no client certificate: whatever reaches its "
                   "Service gets the injection patch of A's policy (bucket, prefix, endpoint, "
                   "Secret name; no Secret values) and holds a writer rank for 30 s",
}

#: Where the suite writes the table of its run, when set (docs/security.md
#: shows the command).
TABLE_ENV = "CKPTDRAIN_HOSTILE_TABLE"


@dataclass(frozen=True)
class Attempt:
    name: str
    refused_by: str  # what refused it; "" when nothing did
    logged: str  # where the refusal can be read afterwards
    leaked: int  # files, objects or settings of A's that reached B


def table(attempts: list[Attempt]) -> str:
    """The markdown table docs/security.md shows, with its totals."""
    rows = ["| attempt | refused by | logged | leaked |", "| --- | --- | --- | --- |"]
    rows += [f"| {a.name} | {a.refused_by or 'NOT REFUSED'} | {a.logged or '—'} | {a.leaked} |"
             for a in attempts]
    refused = sum(1 for a in attempts if a.refused_by)
    leaked = sum(a.leaked for a in attempts)
    rows.append(f"\nattempts: {len(attempts)}, refused: {refused}, leaked: {leaked}")
    return "\n".join(rows) + "\n"


def write_table(attempts: list[Attempt]) -> str:
    text = table(attempts)
    target = os.environ.get(TABLE_ENV)
    if target:
        Path(target).write_text(text)
    return text
