"""Tenants' node directories never nest (hostPath mode). Pure.

A policy of namespace `n` with `spec.localTier.path` `p` gives its pods the
hostPath `p/n/<policy>` on every node (spec.Policy.node_path); `p/n` is
that namespace's node directory under `p`:

    <p>/                  spec.localTier.path
      <n>/                the namespace's node directory (this module's unit)
        <policy>/         one policy's local tier, mounted into its pods

The rule: two policies of different namespaces have node directories
(`normpath(p/n)`, compared by whole path components) that are neither
equal nor one inside the other. This also covers a `p` inside another
namespace's `p'/n'` (then `p/n` lies inside it) and a `p` around it whose
`p/n` would hold it (a namespace named like a directory on the other's
path). Were they to nest, one tenant's pod would be given a directory
inside the other's tree, or around it, and read or fill the other's data.

Policies of one namespace may share a path, or nest: their pods' dirs
differ by policy name, and a namespace's policies trust each other.

Under the CSI driver the node data is keyed by namespace and policy UID
(csi/volumes.py), not by this path: the rule is for hostPath mode only.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

FIELD = "spec.localTier.path"


@dataclass(frozen=True)
class NodeDir:
    """One policy's namespace node directory."""

    namespace: str
    policy: str
    directory: str


def namespace_dir(path: str, namespace: str) -> str:
    """`path/namespace`, normalised (`//`, `.` and trailing slashes gone;
    a leading `//` too, which normpath keeps but Linux reads as `/`)."""
    return "/" + posixpath.normpath(posixpath.join(path, namespace)).lstrip("/")


def nest(a: str, b: str) -> bool:
    """Whether directories `a` and `b` (normalised) are equal or one holds
    the other, by whole components: /x/ab neither holds nor lies in /x/a."""
    if a == b:
        return True
    shorter, longer = (a, b) if len(a) < len(b) else (b, a)
    return longer.startswith(shorter.rstrip("/") + "/")


def of_policy(body: Mapping[str, Any]) -> NodeDir | None:
    """The node directory of a stored policy, or None when it has no
    absolute localTier.path (it injects no hostPath)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") if isinstance(body.get("spec"), Mapping) else {}
    local = spec.get("localTier") if isinstance(spec.get("localTier"), Mapping) else {}
    path = local.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        return None
    namespace = str(meta.get("namespace") or "")
    return NodeDir(namespace, str(meta.get("name") or ""), namespace_dir(path, namespace))


def first_clash(namespace: str, path: str, others: Iterable[Mapping[str, Any]],
                created: str | None = None) -> NodeDir | None:
    """The first policy of another namespace among `others` whose node
    directory nests with `path/namespace`; None when none does. With
    `created` (the creationTimestamp of the policy judged), only policies
    created at or before it count: of two nesting policies the older one's
    pods keep working, so a newcomer that got past policy admission (two
    creations at once on two replicas) never stops a running tenant's pods."""
    mine = namespace_dir(path, namespace)
    for body in others:
        theirs = of_policy(body)
        if theirs is None or theirs.namespace == namespace \
                or not nest(mine, theirs.directory):
            continue
        since = str((body.get("metadata") or {}).get("creationTimestamp") or "")
        if created and since and since > created:
            continue  # RFC3339 in UTC: the text orders as the time does
        return theirs
    return None


def policy_refusal(namespace: str, path: str) -> str:
    """What admission says to a policy whose node directory nests with
    another namespace's. The other namespace and policy are not named: the
    tenant may not read them (RBAC), and the refusal must not tell more
    than that some other namespace's directory is there."""
    return (f"{FIELD}: {path} would place this namespace's node directory "
            f"{namespace_dir(path, namespace)} equal to, inside or around another "
            "namespace's node directory, and one tenant's pods would reach the other's "
            f"data; expected a path whose <path>/{namespace} neither holds nor lies in "
            "another namespace's (the path your platform documents for the local tier)")


def pod_refusal(policy: str, namespace: str, path: str) -> str:
    """What pod admission says when the selecting policy's node directory
    nests with another namespace's (policies admitted before this rule, or
    two created at once on two replicas)."""
    return (f"CheckpointPolicy {policy} {FIELD}: its node directory "
            f"{namespace_dir(path, namespace)} is equal to, inside or around another "
            "namespace's node directory; the pod is not injected, so that no tenant's "
            f"pod reaches another's data: change {FIELD} of policy {policy} (or ask the "
            "platform team which other namespace's policy to move)")
