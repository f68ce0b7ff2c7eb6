"""The cloud identity a platform webhook gives the trainer, carried over to
ckptdrain's containers whatever order the webhooks run in. Pure.

On EKS, IRSA and EKS Pod Identity reach a pod through a mutating webhook
that adds environment variables and a projected service-account token volume
to every container present when it runs. Mutating webhooks run in the order
of their configurations' names, and ours is named after the Helm release:
when it sorts after the platform's, the trainer has the identity and the
agent and restore containers we add do not, so their S3 calls fail. So
admission copies, from the first application container that has them, the
identity variables and the token mount behind each token-file variable into
the containers that talk to the store (restore and the agent), on the first
call and again on reinvocation.

Nothing is carried into a container that has explicit credentials (the
policy's `credentialsSecretRef`: its keys win in the S3 client's chain
anyway, and a policy that chose a Secret chose it), a variable already set
is never changed, and only a mount of a projected volume made purely of
service-account tokens is carried: a variable whose file would not be there
is dropped with a warning rather than handed over as a path to nothing.
"""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: What IRSA (`AWS_ROLE_ARN`, `AWS_WEB_IDENTITY_TOKEN_FILE`) and EKS Pod
#: Identity (`AWS_CONTAINER_CREDENTIALS_FULL_URI`, its token file) set, with
#: the region and STS endpoint choice that come with them.
IDENTITY_ENV = (
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_SESSION_NAME",
    "AWS_STS_REGIONAL_ENDPOINTS",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)
TOKEN_FILE_ENV = frozenset({"AWS_WEB_IDENTITY_TOKEN_FILE",
                            "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"})
#: Set by the policy's Secret: a container that has it takes no ambient identity.
EXPLICIT_CREDENTIALS = "AWS_ACCESS_KEY_ID"


@dataclass(frozen=True)
class Ambient:
    """The identity found on the pod's application containers."""
    env: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    #: Why a variable found was not carried (its file cannot be mounted).
    problems: list[str] = field(default_factory=list)


def _env_value(entry: Mapping[str, Any]) -> str | None:
    value = entry.get("value")
    return value if isinstance(value, str) else None


def _token_volume(volumes: Sequence[Mapping[str, Any]], name: str) -> bool:
    """A projected volume whose every source is a service-account token."""
    for volume in volumes:
        if volume.get("name") == name:
            sources = (volume.get("projected") or {}).get("sources") or []
            return bool(sources) and all(
                isinstance(s, Mapping) and set(s) == {"serviceAccountToken"} for s in sources)
    return False


def _mount_for(path: str, container: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container's mount that holds `path` (the deepest one)."""
    best: Mapping[str, Any] | None = None
    for mount in container.get("volumeMounts") or []:
        root = str(mount.get("mountPath") or "").rstrip("/")
        if root and path.startswith(root + "/") and (
                best is None or len(root) > len(str(best.get("mountPath")).rstrip("/"))):
            best = mount
    return best


def ambient(pod: Mapping[str, Any]) -> Ambient:
    """The identity of the first application container that has any."""
    spec = pod.get("spec") or {}
    volumes = spec.get("volumes") or []
    for container in spec.get("containers") or []:
        found = {e.get("name"): e for e in container.get("env") or []
                 if isinstance(e, Mapping) and e.get("name") in IDENTITY_ENV}
        if not found:
            continue
        env: list[dict[str, Any]] = []
        mounts: list[dict[str, Any]] = []
        problems: list[str] = []
        for name in IDENTITY_ENV:
            entry = found.get(name)
            if entry is None:
                continue
            if name in TOKEN_FILE_ENV:
                path = _env_value(entry)
                mount = _mount_for(posixpath.normpath(path), container) if path else None
                if mount is None or mount.get("subPath") or not _token_volume(
                        volumes, str(mount.get("name"))):
                    problems.append(
                        f"{name} of container {container.get('name')} is not a file of a "
                        "projected service-account token volume; not carried")
                    continue
                carried = {"name": mount["name"], "mountPath": mount["mountPath"],
                           "readOnly": True}
                if carried not in mounts:
                    mounts.append(carried)
            env.append(copy.deepcopy(dict(entry)))
        return Ambient(env, mounts, problems)
    return Ambient()


def _under(path: str, roots: Sequence[str]) -> bool:
    path = posixpath.normpath(path)
    return any(path.startswith(str(root).rstrip("/") + "/") for root in roots)


def additions(container: Mapping[str, Any], found: Ambient
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The variables and mounts `container` lacks of `found`: ([env], [mounts]).
    A mount whose path or volume the container already uses otherwise is not
    added, and neither is the token-file variable that needs it."""
    have = {e.get("name") for e in container.get("env") or [] if isinstance(e, Mapping)}
    if EXPLICIT_CREDENTIALS in have:
        return [], []
    mounted = container.get("volumeMounts") or []
    same = {(m.get("name"), m.get("mountPath")) for m in mounted}
    paths = {m.get("mountPath") for m in mounted}
    names = {m.get("name") for m in mounted}
    mounts: list[dict[str, Any]] = []
    usable: list[str] = []
    for mount in found.mounts:
        if (mount["name"], mount["mountPath"]) in same:
            usable.append(mount["mountPath"])
        elif mount["mountPath"] not in paths and mount["name"] not in names:
            mounts.append(mount)
            usable.append(mount["mountPath"])
    env = [e for e in found.env if e["name"] not in have and (
        e["name"] not in TOKEN_FILE_ENV or _under(str(e.get("value")), usable))]
    return env, mounts
