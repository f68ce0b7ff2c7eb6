"""Which store identity a selected pod's ckptdrain containers get, and the
pieces of the pod that carry it. Pure.

Where the platform maps the pod's namespace to a role
(CKPTDRAIN_AGENT_IDENTITIES, operator/tenant_identities.py), restore and
the agent, the only containers of ours that reach the store, get:

- a projected ServiceAccount-token volume of their own (VOLUME; the
  mapping's audience and expiration), mounted read-only at TOKEN_DIR: no
  other container of the pod mounts it, so the trainer cannot read it;
- AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_SESSION_NAME and
  AWS_STS_REGIONAL_ENDPOINTS=regional, which botocore's default chain turns
  into AssumeRoleWithWebIdentity (re-reading the file the kubelet renews).

The trainer gets neither unless its policy asks (`spec.storage.trainerAccess`,
for a trainer that loads steps from the store itself): then every
application container mounts the same volume and gets the same variables,
except one that holds a store identity of its own, which keeps it.
Admission warns either way (`trainer_warnings`): a trainer without the
identity reads only what restore placed on the node, and one with its own
role is outside what the mapping promises.

The mapping wins over an identity a platform webhook gave the trainer: that
one is not carried into our containers (admission/cloud_identity.py), and
our containers are named in `eks.amazonaws.com/skip-containers` so that
such a webhook running after ours leaves them alone. A policy's
`credentialsSecretRef` wins over the mapping: the policy asked for keys.
Only s3:// stores use it: a gs:// store speaks to Google, whose identity
GKE gives the whole pod (docs/cloud/gke.md).

For a gs:// store whose class names a Google service account
(spec.identity.googleServiceAccount), restore and the agent, and never the
trainer, get CKPTDRAIN_GOOGLE_SERVICE_ACCOUNT (`google_env`): they
impersonate that account with the pod's own Google identity
(store/gcs_auth.py), so each tenant's are a principal of its own.

The token is the pod's ServiceAccount's, like any other; what makes it the
tenant's is the role's trust policy, which accepts only tokens whose
subject is in that namespace, with this audience (docs/cloud/eks.md).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from ckptdrain.contract.env import Env
from ckptdrain.operator import tenant_identities
from ckptdrain.operator.policy.spec import Policy
from ckptdrain.operator.tenant_identities import Identities, WebIdentity

VOLUME = "ckptdrain-store-token"
#: Under /var/run/secrets/, where cloud_identity.py looks for token mounts,
#: and apart from EKS's own (/var/run/secrets/eks.amazonaws.com/...).
TOKEN_DIR = "/var/run/secrets/ckptdrain/store-token"
TOKEN_PATH = "token"
#: What STS takes as a RoleSessionName; CloudTrail shows it.
MAX_SESSION_NAME = 64
#: A container holding one of these reaches the store as someone already:
#: web identity (IRSA, or ours), EKS Pod Identity, or access keys.
OWN_CREDENTIALS = frozenset({"AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
                             "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_ACCESS_KEY_ID"})
#: What admission says of each of those it finds on an application container.
SHOWN_CREDENTIALS = ("AWS_ROLE_ARN", "AWS_CONTAINER_CREDENTIALS_FULL_URI")


def chosen(policy: Policy, identities: Identities) -> WebIdentity | None:
    """The identity the platform maps the policy's namespace to, for its
    pods' restore and agent; None where the policy names a Secret, its
    store is not S3, or the namespace is not mapped (the pod's own identity,
    as before)."""
    if policy.credentials is not None or not policy.store_uri.startswith("s3://"):
        return None
    return tenant_identities.of(identities, policy.namespace)


def google_account(policy: Policy, accounts: tuple[tuple[str, str], ...]) -> str | None:
    """The Google service account restore and the agent impersonate for the
    policy's gs:// store (its class's, for its namespace); None otherwise."""
    if not policy.store_uri.startswith("gs://"):
        return None
    return next((account for name, account in accounts if name == policy.namespace), None)


def google_env(account: str | None) -> list[dict[str, Any]]:
    return [] if account is None else [{"name": Env.GOOGLE_SERVICE_ACCOUNT.value,
                                        "value": account}]


def session_name(namespace: str) -> str:
    """`ckptdrain-<namespace>`, at most 64 characters of [a-z0-9-] (STS
    accepts [\\w+=,.@-]{2,64})."""
    return f"ckptdrain-{namespace}"[:MAX_SESSION_NAME]


def volume(identity: WebIdentity) -> dict[str, Any]:
    return {"name": VOLUME, "projected": {"sources": [{"serviceAccountToken": {
        "audience": identity.audience, "expirationSeconds": identity.expiration_s,
        "path": TOKEN_PATH}}]}}


def mount() -> dict[str, Any]:
    return {"name": VOLUME, "mountPath": TOKEN_DIR, "readOnly": True}


def env(identity: WebIdentity, namespace: str) -> list[dict[str, Any]]:
    return [{"name": "AWS_ROLE_ARN", "value": identity.role_arn},
            {"name": "AWS_WEB_IDENTITY_TOKEN_FILE",
             "value": posixpath.join(TOKEN_DIR, TOKEN_PATH)},
            {"name": "AWS_ROLE_SESSION_NAME", "value": session_name(namespace)},
            {"name": "AWS_STS_REGIONAL_ENDPOINTS", "value": "regional"}]


def holds(container: Mapping[str, Any]) -> bool:
    """Whether `container` was given the tenant's identity (on reinvocation:
    nothing of the trainer's is carried into it then)."""
    return any(m.get("name") == VOLUME for m in container.get("volumeMounts") or [])


def for_trainer(policy: Policy, identity: WebIdentity | None) -> WebIdentity | None:
    """The identity the application containers get: the namespace's, where
    the policy asks (spec.storage.trainerAccess); else None."""
    return identity if identity is not None and policy.trainer_access else None


def trainer_additions(container: Mapping[str, Any], identity: WebIdentity, namespace: str
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What application container `container` gets of the namespace's
    identity: ([env], [mounts]). Nothing when it holds a credential of its
    own (its own stays: mixing our token with its role would be neither),
    or uses the token's path or volume name otherwise."""
    have = {e.get("name") for e in container.get("env") or [] if isinstance(e, Mapping)}
    if have & OWN_CREDENTIALS:
        return [], []
    for m in container.get("volumeMounts") or []:
        if m.get("name") == VOLUME or posixpath.normpath(str(m.get("mountPath"))) == TOKEN_DIR:
            return [], []
    return [e for e in env(identity, namespace) if e["name"] not in have], [mount()]


def _ours(container: Mapping[str, Any]) -> bool:
    token = posixpath.join(TOKEN_DIR, TOKEN_PATH)
    return any(e.get("name") == "AWS_WEB_IDENTITY_TOKEN_FILE" and e.get("value") == token
               for e in container.get("env") or [] if isinstance(e, Mapping))


def own_identities(pod: Mapping[str, Any], namespace: str) -> list[str]:
    """One admission warning per application container holding a store
    identity of its own (its ServiceAccount's EKS role, a Pod Identity
    association): not the namespace's, so outside what the mapping keeps
    apart."""
    found_in = []
    for c in pod.get("spec", {}).get("containers") or []:
        names = {e.get("name") for e in c.get("env") or [] if isinstance(e, Mapping)}
        found = [n for n in SHOWN_CREDENTIALS if n in names]
        if found and not _ours(c):
            found_in.append(f"ckptdrain: container {c.get('name')} holds its own store "
                            f"identity ({', '.join(found)}), not namespace {namespace}'s: the "
                            "mapping keeps restore and the agent to the tenant's prefix, not "
                            "this container")
    return found_in


def trainer_warnings(pod: Mapping[str, Any], policy: Policy) -> list[str]:
    """Admission warnings for a pod whose restore and agent hold the
    namespace's identity: `own_identities`; else, without
    spec.storage.trainerAccess, that the trainer has none."""
    own = own_identities(pod, policy.namespace)
    if own or policy.trainer_access:
        return own
    return [f"ckptdrain: policy {policy.name}: the trainer gets no store identity in namespace "
            f"{policy.namespace}; set spec.storage.trainerAccess to let it read checkpoints "
            "itself (DCP load, resharding)"]


def volume_problem(pod: Mapping[str, Any], identity: WebIdentity) -> str | None:
    """Why the pod cannot be given the token volume: it has a volume of that
    name that is not ours (None: no such volume, or exactly ours). Admission
    refuses such a pod rather than replace the volume: the pod's own
    containers may mount it, and a replacement would hand them our token in
    place of what they expected; kept as it is, restore and the agent would
    mount the pod's volume in place of the token, and fail or act as
    someone else."""
    for i, v in enumerate(pod.get("spec", {}).get("volumes") or []):
        if isinstance(v, Mapping) and v.get("name") == VOLUME and not _same(v, volume(identity)):
            return (f"spec.volumes[{i}]: the volume name {VOLUME} is ckptdrain's (the store "
                    "token of restore and the agent in this namespace), and this one is not "
                    "the token they need; rename the pod's volume")
    return None


def _same(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> bool:
    """The same projected token, whatever defaultMode the apiserver filled in."""
    projected = theirs.get("projected")
    return (set(theirs) == {"name", "projected"} and isinstance(projected, Mapping)
            and set(projected) <= {"sources", "defaultMode"}
            and projected.get("sources") == ours["projected"]["sources"])
