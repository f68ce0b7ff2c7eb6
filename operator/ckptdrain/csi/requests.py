"""What kubelet asks of the driver, checked before anything touches the node.

Pure: strings in, a typed request or a `Refused` (with the gRPC code the CSI
spec names) out. Two sources, trusted differently:

- kubelet's own: the volume id, the target path, and, because the CSIDriver
  object sets podInfoOnMount, the `csi.storage.k8s.io/*` attributes (pod
  namespace, name, uid, service account; `ephemeral` for an inline volume).
  kubelet writes these over any value the pod's spec gave. Were
  podInfoOnMount ever off, the tenant's own values would pass through: what
  still ties the namespace to the pod is the pod uid, checked against the
  target path kubelet chose. A pod's uid is made by the apiserver when the
  pod is created, after its spec (and so its volumeAttributes) is written,
  so a tenant cannot name its own pod's uid, and a made-up one does not
  match the target. Still checked for shape: they become path parts.
- the tenant's: every other volume attribute, written in the pod's spec by
  whoever may create pods. Only `policy` (a CheckpointPolicy's name) is
  accepted; it is looked up in the pod's own namespace and never becomes a
  path: the policy's UID does (volumes.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from ckptdrain.contract.csi import DEFAULT_MIN_MOUNT_GROUP

EPHEMERAL = "csi.storage.k8s.io/ephemeral"
POD_NAMESPACE = "csi.storage.k8s.io/pod.namespace"
POD_NAME = "csi.storage.k8s.io/pod.name"
POD_UID = "csi.storage.k8s.io/pod.uid"
SERVICE_ACCOUNT = "csi.storage.k8s.io/serviceAccount.name"
# Sent only when the CSIDriver object asks for tokens: accepted, never used
# and never printed (it is a credential).
SERVICE_ACCOUNT_TOKENS = "csi.storage.k8s.io/serviceAccount.tokens"
KUBELET_ATTRIBUTES = frozenset(
    {EPHEMERAL, POD_NAMESPACE, POD_NAME, POD_UID, SERVICE_ACCOUNT, SERVICE_ACCOUNT_TOKENS})
POLICY_ATTRIBUTE = "policy"

# kubelet's mount dir for a CSI volume of a pod:
#   <pods dir>/<pod uid>/volumes/kubernetes.io~csi/<volume name>/mount
CSI_PLUGIN_DIR = "kubernetes.io~csi"

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# kubelet names an inline volume csi-<sha256 hex>; other COs use similar ids.
_VOLUME_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_MAX_GID = 2**31 - 1


class Refused(Exception):
    """A request the driver will not carry out; `code` is the name of the
    gRPC status code (grpc.StatusCode) the CSI spec gives for the case."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class PublishRequest:
    volume_id: str
    target_path: PurePosixPath
    namespace: str
    pod_name: str
    pod_uid: str
    policy_name: str
    read_only: bool
    # The pod's fsGroup, from kubelet (VOLUME_MOUNT_GROUP); None without one.
    mount_group: int | None


@dataclass(frozen=True)
class UnpublishRequest:
    volume_id: str
    target_path: PurePosixPath


def _invalid(field: str, expected: str, seen: str) -> Refused:
    # `seen` is a name or path kubelet or the tenant sent, cut short: never a token.
    return Refused("INVALID_ARGUMENT", f"{field}: expected {expected}, got {seen[:256]!r}")


def check_name(value: str, field: str, pattern: re.Pattern[str], expected: str) -> str:
    if not pattern.fullmatch(value):
        raise _invalid(field, expected, value)
    return value


def check_volume_id(value: str) -> str:
    return check_name(value, "volume_id", _VOLUME_ID,
                      "1 to 128 of [A-Za-z0-9._-], starting alphanumeric")


def check_policy_uid(value: str) -> str:
    return check_name(value, "CheckpointPolicy metadata.uid", _UID, "a lower-case UUID")


def check_target(value: str, pods_dir: PurePosixPath, pod_uid: str | None = None
                 ) -> PurePosixPath:
    """kubelet's mount dir for a CSI volume of one pod, spelled exactly (no
    `..`, `.`, doubled or trailing slash), under `pods_dir`; of pod `pod_uid`
    when given."""
    expected = (f"{pods_dir}/<pod uid>/volumes/{CSI_PLUGIN_DIR}/<volume name>/mount")
    path = PurePosixPath(value)
    if not value.startswith("/") or str(path) != value or ".." in path.parts:
        raise _invalid("target_path", expected, value)
    try:
        rest = path.relative_to(pods_dir).parts
    except ValueError:
        raise _invalid("target_path", expected, value) from None
    if (len(rest) != 5 or not _UID.fullmatch(rest[0]) or rest[1:3] != ("volumes", CSI_PLUGIN_DIR)
            or not _DNS_LABEL.fullmatch(rest[3]) or rest[4] != "mount"):
        raise _invalid("target_path", expected, value)
    if pod_uid is not None and rest[0] != pod_uid:
        raise _invalid("target_path", f"a path of pod {pod_uid} ({expected})", value)
    return path


def _mount_group(value: str, min_group: int) -> int | None:
    # The group gets write access to the data: root's group (0) or a
    # system group (below min_group) would hand it to the node's daemons.
    if value == "":
        return None
    if not value.isdigit() or not min_group <= int(value) <= _MAX_GID:
        raise _invalid("volume_capability.mount.volume_mount_group (the pod's fsGroup)",
                       f"a group id from {min_group} to {_MAX_GID} (system groups are "
                       "refused: the group may write the data)", value)
    return int(value)


def publish_request(volume_id: str, target_path: str, context: Mapping[str, str],
                    read_only: bool, mount_group: str, pods_dir: PurePosixPath,
                    min_group: int = DEFAULT_MIN_MOUNT_GROUP) -> PublishRequest:
    """A NodePublishVolume request, checked; raises `Refused`."""
    check_volume_id(volume_id)
    if context.get(EPHEMERAL) != "true":
        raise Refused("INVALID_ARGUMENT",
                      f"volume_context[{EPHEMERAL}]: expected \"true\": this driver serves "
                      "CSI ephemeral inline volumes only (a pod's volumes[].csi)")
    for key in (POD_NAMESPACE, POD_NAME, POD_UID):
        if not context.get(key):
            raise Refused("INVALID_ARGUMENT",
                          f"volume_context[{key}]: missing; the CSIDriver object must set "
                          "podInfoOnMount: true")
    unknown = sorted(set(context) - KUBELET_ATTRIBUTES - {POLICY_ATTRIBUTE})
    if unknown:
        raise Refused("INVALID_ARGUMENT",
                      f"volumeAttributes[{unknown[0][:80]!r}]: not accepted; the only "
                      f"attribute is {POLICY_ATTRIBUTE!r} (a CheckpointPolicy name)")
    namespace = check_name(context[POD_NAMESPACE], POD_NAMESPACE, _DNS_LABEL,
                           "a namespace name (DNS-1123 label)")
    pod_uid = check_name(context[POD_UID], POD_UID, _UID, "a lower-case UUID")
    pod_name = check_name(context[POD_NAME], POD_NAME, _DNS_SUBDOMAIN,
                          "a pod name (DNS-1123 subdomain)")
    policy = context.get(POLICY_ATTRIBUTE, "")
    check_name(policy, f"volumeAttributes.{POLICY_ATTRIBUTE}", _DNS_SUBDOMAIN,
               "the name of a CheckpointPolicy in the pod's namespace (DNS-1123 subdomain)")
    return PublishRequest(
        volume_id=volume_id,
        target_path=check_target(target_path, pods_dir, pod_uid),
        namespace=namespace, pod_name=pod_name, pod_uid=pod_uid, policy_name=policy,
        read_only=read_only, mount_group=_mount_group(mount_group, min_group))


def unpublish_request(volume_id: str, target_path: str, pods_dir: PurePosixPath
                      ) -> UnpublishRequest:
    """A NodeUnpublishVolume request, checked; raises `Refused`."""
    return UnpublishRequest(check_volume_id(volume_id), check_target(target_path, pods_dir))
