"""The CSI node driver's one config object, from flags with environment
defaults (the DaemonSet sets the environment), checked at start.

  CKPTDRAIN_CSI_NAME        driver name, the CSIDriver object's  (node.ckptdrain.io)
  NODE_NAME                 this node's name: the CSI node id    (required; downward API)
  CKPTDRAIN_CSI_ROOT        where policies' node data lives      (/var/lib/ckptdrain/csi)
  CKPTDRAIN_CSI_PODS_DIR    kubelet's pods dir: the only place volumes are
                            mounted                              (/var/lib/kubelet/pods)
  CKPTDRAIN_CSI_SOCKET      the CSI socket      (/var/lib/kubelet/plugins/<name>/csi.sock)
  CKPTDRAIN_CSI_REGISTRATION_SOCKET
                            the registration socket kubelet watches for
                            (/var/lib/kubelet/plugins_registry/<name>-reg.sock)
  CKPTDRAIN_CSI_OWNER_UID   who owns the data: the agent's uid   (65532)
  CKPTDRAIN_CSI_MIN_MOUNT_GROUP
                            the lowest fsGroup a pod's data may get; lower
                            ones (root's 0, system groups) are refused (1000)
  CKPTDRAIN_CSI_RECLAIM_POLICY
                            what becomes of a deleted policy's node data
                            where its class says nothing (spec.nodeTier.reclaim):
                            Delete (after the grace period) or Retain (Delete)
  CKPTDRAIN_CSI_RECLAIM_GRACE_PERIOD
                            how long its policy must have been seen deleted
                            before the data is deleted (1h; docs/csi-driver.md
                            says why)
  CKPTDRAIN_CSI_SCAN_INTERVAL
                            how often the root is scanned: usage measured,
                            deleted policies' data collected (60s)
  CKPTDRAIN_CSI_METRICS_PORT
                            /metrics and /healthz; 0: none (9110)
  CKPTDRAIN_CSI_NAMESPACE   the driver's own namespace, where it publishes its
                            node's free space as a CSIStorageCapacity
                            (capacity_report.py); empty: not published (unset;
                            the chart sets it from the downward API)
  CKPTDRAIN_CSI_POD_NAME, CKPTDRAIN_CSI_POD_UID
                            the driver's own Pod, in that namespace: it owns
                            the report, which goes with it (unset: no owner;
                            the chart sets both from the downward API)
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ckptdrain import units
from ckptdrain.contract.csi import (
    DEFAULT_DRIVER_NAME,
    DEFAULT_MIN_MOUNT_GROUP,
)
from ckptdrain.csi.collection import DELETE, RECLAIM_POLICIES, Reclaim
from ckptdrain.errors import InvalidInput

DEFAULT_NAME = DEFAULT_DRIVER_NAME
# A CSI driver name: a DNS-1123 subdomain of at most 63 characters.
_DRIVER_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_POD_NAME = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
DEFAULT_GRACE_PERIOD = "1h"
DEFAULT_SCAN_INTERVAL = "60s"
DEFAULT_METRICS_PORT = 9110
DEFAULT_RECLAIM = Reclaim(DELETE, 3600.0)


@dataclass(frozen=True)
class DriverConfig:
    name: str
    node_id: str
    root: Path
    pods_dir: PurePosixPath
    csi_socket: Path
    registration_socket: Path
    owner_uid: int
    min_mount_group: int = DEFAULT_MIN_MOUNT_GROUP
    reclaim: Reclaim = DEFAULT_RECLAIM
    scan_interval_s: float = 60.0
    metrics_port: int = 0  # 0: no metrics endpoint (the flag's default is 9110)
    capacity_namespace: str = ""  # "": the free space is not published
    pod: tuple[str, str] | None = None  # the driver's own Pod (name, uid): owns the report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument("--name", default=env("CKPTDRAIN_CSI_NAME", DEFAULT_NAME),
                        help="the driver's name, as in the CSIDriver object (default: %(default)s)")
    parser.add_argument("--node-id", default=env("NODE_NAME", ""),
                        help="this node's name (default: $NODE_NAME)")
    parser.add_argument("--root", default=env("CKPTDRAIN_CSI_ROOT", "/var/lib/ckptdrain/csi"),
                        help="where policies' node data lives (default: %(default)s)")
    parser.add_argument("--pods-dir",
                        default=env("CKPTDRAIN_CSI_PODS_DIR", "/var/lib/kubelet/pods"),
                        help="kubelet's pods dir; targets elsewhere are refused "
                             "(default: %(default)s)")
    parser.add_argument("--csi-socket", default=env("CKPTDRAIN_CSI_SOCKET"),
                        help="the CSI socket (default: /var/lib/kubelet/plugins/NAME/csi.sock)")
    parser.add_argument("--registration-socket",
                        default=env("CKPTDRAIN_CSI_REGISTRATION_SOCKET"),
                        help="the socket kubelet's plugin watcher finds "
                             "(default: /var/lib/kubelet/plugins_registry/NAME-reg.sock)")
    parser.add_argument("--owner-uid", default=env("CKPTDRAIN_CSI_OWNER_UID", "65532"),
                        help="owner of the node data: the agent's uid (default: %(default)s)")
    parser.add_argument("--min-mount-group",
                        default=env("CKPTDRAIN_CSI_MIN_MOUNT_GROUP",
                                    str(DEFAULT_MIN_MOUNT_GROUP)),
                        help="the lowest fsGroup a pod's data may get (default: %(default)s)")
    parser.add_argument("--reclaim-policy",
                        default=env("CKPTDRAIN_CSI_RECLAIM_POLICY", DELETE),
                        help="a deleted policy's node data: Delete (after the grace period) "
                             "or Retain (default: %(default)s)")
    parser.add_argument("--reclaim-grace-period",
                        default=env("CKPTDRAIN_CSI_RECLAIM_GRACE_PERIOD", DEFAULT_GRACE_PERIOD),
                        help="how long a policy must have been seen deleted before its node "
                             "data is deleted (default: %(default)s)")
    parser.add_argument("--scan-interval",
                        default=env("CKPTDRAIN_CSI_SCAN_INTERVAL", DEFAULT_SCAN_INTERVAL),
                        help="how often the root is scanned (default: %(default)s)")
    parser.add_argument("--metrics-port",
                        default=env("CKPTDRAIN_CSI_METRICS_PORT", str(DEFAULT_METRICS_PORT)),
                        help="port of /metrics and /healthz, 0 for none (default: %(default)s)")
    parser.add_argument("--capacity-namespace", default=env("CKPTDRAIN_CSI_NAMESPACE", ""),
                        help="where to publish the node's free space as a CSIStorageCapacity; "
                             "empty: nowhere (default: $CKPTDRAIN_CSI_NAMESPACE)")
    parser.add_argument("--pod-name", default=env("CKPTDRAIN_CSI_POD_NAME", ""),
                        help="the driver's own Pod, in the capacity namespace: it owns the "
                             "report (default: $CKPTDRAIN_CSI_POD_NAME)")
    parser.add_argument("--pod-uid", default=env("CKPTDRAIN_CSI_POD_UID", ""),
                        help="that Pod's uid (default: $CKPTDRAIN_CSI_POD_UID)")


def _absolute(value: str, flag: str) -> str:
    if not value.startswith("/") or ".." in PurePosixPath(value).parts:
        raise InvalidInput(flag, "an absolute path without '..'", value)
    return os.path.normpath(value)


def load(args: argparse.Namespace) -> DriverConfig:
    """The config from parsed flags; raises InvalidInput naming the flag."""
    if not _DRIVER_NAME.fullmatch(args.name):
        raise InvalidInput("--name", "a DNS-1123 subdomain of at most 63 characters",
                           args.name)
    if not args.node_id:
        raise InvalidInput("--node-id", "this node's name (NODE_NAME from spec.nodeName)",
                           None)
    if not str(args.owner_uid).isdigit():
        raise InvalidInput("--owner-uid", "a numeric uid", args.owner_uid)
    if not str(args.min_mount_group).isdigit() or int(args.min_mount_group) < 1:
        raise InvalidInput("--min-mount-group", "a group id of 1 or more (0, root's group, "
                           "is never given the data)", args.min_mount_group)
    if args.reclaim_policy not in RECLAIM_POLICIES:
        raise InvalidInput("--reclaim-policy", " or ".join(RECLAIM_POLICIES),
                           args.reclaim_policy)
    grace_s = units.parse_duration("--reclaim-grace-period", args.reclaim_grace_period)
    interval_s = units.parse_duration("--scan-interval", args.scan_interval)
    port = str(args.metrics_port)
    if not port.isdigit() or int(port) > 65535:
        raise InvalidInput("--metrics-port", "a port number (0 for no metrics)", port)
    namespace = args.capacity_namespace or ""
    if namespace and not _NAMESPACE.fullmatch(namespace):
        raise InvalidInput("--capacity-namespace", "a namespace name (a DNS-1123 label)",
                           namespace)
    pod = _pod(args.pod_name or "", args.pod_uid or "")
    csi_socket = args.csi_socket or f"/var/lib/kubelet/plugins/{args.name}/csi.sock"
    registration = (args.registration_socket
                    or f"/var/lib/kubelet/plugins_registry/{args.name}-reg.sock")
    pods_dir = _absolute(args.pods_dir, "--pods-dir")
    # Targets are checked to have no link in their path: a pods dir reached
    # through one (kubelet's --root-dir moved, a link left behind) would
    # refuse every volume, so it is refused once, here.
    if os.path.exists(pods_dir) and os.path.realpath(pods_dir) != pods_dir:
        raise InvalidInput("--pods-dir", f"kubelet's real pods dir, not one reached through "
                           f"a link (this is {os.path.realpath(pods_dir)})", pods_dir)
    return DriverConfig(
        name=args.name, node_id=args.node_id,
        root=Path(_absolute(args.root, "--root")),
        pods_dir=PurePosixPath(pods_dir),
        csi_socket=Path(_absolute(csi_socket, "--csi-socket")),
        registration_socket=Path(_absolute(registration, "--registration-socket")),
        owner_uid=int(args.owner_uid), min_mount_group=int(args.min_mount_group),
        reclaim=Reclaim(args.reclaim_policy, grace_s), scan_interval_s=interval_s,
        metrics_port=int(port), capacity_namespace=namespace, pod=pod)


def _pod(name: str, uid: str) -> tuple[str, str] | None:
    """The owner Pod: both given, or neither."""
    if not name and not uid:
        return None
    if not _POD_NAME.fullmatch(name):
        raise InvalidInput("--pod-name", "the driver's Pod name (a DNS-1123 subdomain), "
                           "given with --pod-uid", name)
    if not _UID.fullmatch(uid):
        raise InvalidInput("--pod-uid", "the driver's Pod uid (a UUID), given with "
                           "--pod-name", uid)
    return name, uid
