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

Nothing is carried where the platform maps the namespace to an identity of
its own (admission/tenant_identity.py: that one wins), nor into a container
that has explicit credentials (the policy's `credentialsSecretRef`: its
keys win in the S3 client's chain anyway, and a policy that chose a Secret
chose it), a variable already set
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

#: The credential variables, each with the token file it needs: both reach
#: a container or neither (a credentials URI without its token makes
#: botocore's chain fail instead of falling through to the next provider).
PAIRS = (("AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"),
         ("AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"))
#: Carried only along with a pair.
COMPANIONS = ("AWS_ROLE_SESSION_NAME", "AWS_STS_REGIONAL_ENDPOINTS")
REGION = ("AWS_REGION", "AWS_DEFAULT_REGION")
IDENTITY_ENV = (*(n for pair in PAIRS for n in pair), *COMPANIONS, *REGION)
TOKEN_FILE_ENV = frozenset(token for _, token in PAIRS)
#: Set by the policy's Secret: a container that has it takes no ambient identity.
EXPLICIT_CREDENTIALS = "AWS_ACCESS_KEY_ID"
#: Where a token mount may be carried to: service-account tokens live here,
#: and none of our own mounts does (a token volume over /ckptdrain or /tmp
#: would hide what the agent needs).
TOKEN_ROOT = "/var/run/secrets/"
#: Containers platform identity webhooks should leave alone (EKS's honours
#: this annotation): the root prepare step and the peer server never reach
#: the store.
SKIP_ANNOTATION = "eks.amazonaws.com/skip-containers"


@dataclass(frozen=True)
class Ambient:
    """The identity found on the pod's application containers."""
    env: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    #: Why something found was not carried.
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
        root = posixpath.normpath(str(mount.get("mountPath") or "/"))
        if root != "/" and path.startswith(root + "/") and (
                best is None or len(root) > len(posixpath.normpath(str(best["mountPath"])))):
            best = mount
    return best


def _token_mount(name: str, entry: Mapping[str, Any], container: Mapping[str, Any],
                 volumes: Sequence[Mapping[str, Any]]) -> dict[str, Any] | str:
    """The mount to carry for token-file variable `entry`, or why there is none."""
    path = _env_value(entry)
    if not path or not path.startswith("/"):
        return f"{name} is not an absolute path"
    path = posixpath.normpath(path)
    mount = _mount_for(path, container)
    if mount is None or mount.get("subPath") or mount.get("subPathExpr") or not _token_volume(
            volumes, str(mount.get("name"))):
        return f"{name} is not a file of a projected service-account token volume"
    mount_path = posixpath.normpath(str(mount["mountPath"]))
    if not (mount_path + "/").startswith(TOKEN_ROOT):
        return f"{name}'s volume is mounted at {mount_path}, outside {TOKEN_ROOT}"
    return {"name": mount["name"], "mountPath": mount_path, "readOnly": True}


def ambient(pod: Mapping[str, Any]) -> Ambient:
    """The identity of the first application container that has a credential
    variable (a region alone is no identity)."""
    spec = pod.get("spec") or {}
    volumes = spec.get("volumes") or []
    for container in spec.get("containers") or []:
        found = {e.get("name"): e for e in container.get("env") or []
                 if isinstance(e, Mapping) and e.get("name") in IDENTITY_ENV}
        if not any(credential in found for credential, _ in PAIRS):
            continue
        where = f"container {container.get('name')}"
        env: list[dict[str, Any]] = []
        mounts: list[dict[str, Any]] = []
        problems: list[str] = []
        for credential, token in PAIRS:
            if credential not in found:
                continue
            pair = [found[credential], found.get(token)]
            if pair[1] is None:
                problems.append(f"{where}: {credential} without {token}; not carried")
                continue
            mount = _token_mount(token, pair[1], container, volumes)
            if isinstance(mount, str):
                problems.append(f"{where}: {mount}; {credential} not carried")
                continue
            if any("$(" in (_env_value(e) or "") for e in pair):
                problems.append(f"{where}: {credential} refers to other variables; not carried")
                continue
            env += [copy.deepcopy(dict(e)) for e in pair]
            if mount not in mounts:
                mounts.append(mount)
        if env:
            env += [copy.deepcopy(dict(found[n])) for n in (*COMPANIONS, *REGION)
                    if n in found and "$(" not in (_env_value(found[n]) or "")]
        return Ambient(env, mounts, problems)
    return Ambient()


def _under(path: str, roots: Sequence[str]) -> bool:
    path = posixpath.normpath(path)
    return any(path.startswith(str(root).rstrip("/") + "/") for root in roots)


def additions(container: Mapping[str, Any], found: Ambient
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The variables and mounts `container` lacks of `found`: ([env], [mounts]).
    A credential and its token file come together or not at all: not when
    the container sets either already, nor when the token's mount path or
    volume is taken otherwise in the container."""
    have = {e.get("name") for e in container.get("env") or [] if isinstance(e, Mapping)}
    if EXPLICIT_CREDENTIALS in have:
        return [], []
    mounted = container.get("volumeMounts") or []
    same = {(m.get("name"), posixpath.normpath(str(m.get("mountPath")))) for m in mounted}
    paths = {posixpath.normpath(str(m.get("mountPath"))) for m in mounted}
    names = {m.get("name") for m in mounted}
    by_name = {e["name"]: e for e in found.env}
    env: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for credential, token in PAIRS:
        if credential not in by_name or credential in have or token in have:
            continue
        mount = next(m for m in found.mounts
                     if _under(str(by_name[token].get("value")), [m["mountPath"]]))
        if (mount["name"], mount["mountPath"]) not in same:
            if mount["mountPath"] in paths or mount["name"] in names:
                continue  # the container uses that path or volume otherwise
            if mount not in mounts:
                mounts.append(mount)
        env += [by_name[credential], by_name[token]]
    if env:
        env += [by_name[n] for n in COMPANIONS if n in by_name and n not in have]
        # The policy's region (under either name) wins over the trainer's.
        if not have & set(REGION):
            env += [by_name[n] for n in REGION if n in by_name]
    return env, mounts


def skip_annotation(existing: Mapping[str, str] | None, names: list[str]) -> dict[str, str]:
    """The annotation that keeps a platform identity webhook run after ours
    out of `names` (ours that never reach the store with ambient identity),
    merged with the pod's own list; {} when it already names them all."""
    key = SKIP_ANNOTATION
    own = [n.strip() for n in str((existing or {}).get(key, "")).split(",") if n.strip()]
    missing = [n for n in names if n not in own]
    return {key: ",".join([*own, *missing])} if missing else {}
