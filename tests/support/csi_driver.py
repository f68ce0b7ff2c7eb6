"""A CSI node driver on unix sockets in a temp dir, and a client speaking
to it as kubelet does (the stubs generated from the CSI and kubelet
protos). Volumes are real bind mounts: the tests using it run as root, as
the driver does. The policy lookup is a dict standing in for the apiserver
(tests/cluster covers the real lookup).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

import grpc
import pytest

from ckptdrain.csi import mounts
from ckptdrain.csi.class_reclaim import ClassLister
from ckptdrain.csi.config import DriverConfig
from ckptdrain.csi.server import Driver
from ckptdrain.csi.stubs import csi_pb2, csi_pb2_grpc
from ckptdrain.csi.volumes import PolicyFound, PolicyResolver

NAME = "node.ckptdrain.io"
UID_A = "11111111-1111-4111-8111-111111111111"
UID_A2 = "22222222-2222-4222-8222-222222222222"
UID_B = "33333333-3333-4333-8333-333333333333"


@dataclass
class Harness:
    cfg: DriverConfig
    driver: Driver
    policies: dict[tuple[str, str], str]
    node: csi_pb2_grpc.NodeStub
    identity: csi_pb2_grpc.IdentityStub
    resolve: PolicyResolver
    targets: list[Path] = field(default_factory=list)
    list_classes: ClassLister | None = None

    def target(self, pod_uid: str, volume: str = "ckptdrain-local") -> Path:
        """kubelet's mount dir for a pod's CSI volume, its parent made as kubelet does."""
        parent = Path(self.cfg.pods_dir) / pod_uid / "volumes" / "kubernetes.io~csi" / volume
        parent.mkdir(parents=True, exist_ok=True)
        self.targets.append(parent / "mount")
        return parent / "mount"

    def publish(self, target: Path, namespace: str, pod_uid: str, policy: str | None = "ckpt",
                volume_id: str | None = None, group: str = "2000",
                extra: dict[str, str] | None = None, readonly: bool = False
                ) -> csi_pb2.NodePublishVolumeResponse:
        context = {"csi.storage.k8s.io/ephemeral": "true",
                   "csi.storage.k8s.io/pod.namespace": namespace,
                   "csi.storage.k8s.io/pod.name": "trainer-0",
                   "csi.storage.k8s.io/pod.uid": pod_uid,
                   "csi.storage.k8s.io/serviceAccount.name": "default"}
        if policy is not None:
            context["policy"] = policy
        context.update(extra or {})
        return self.node.NodePublishVolume(csi_pb2.NodePublishVolumeRequest(
            volume_id=volume_id_of(pod_uid) if volume_id is None else volume_id,
            target_path=str(target),
            volume_capability=csi_pb2.VolumeCapability(
                mount=csi_pb2.VolumeCapability.MountVolume(volume_mount_group=group),
                access_mode=csi_pb2.VolumeCapability.AccessMode(
                    mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER)),
            readonly=readonly, volume_context=context), timeout=10)

    def unpublish(self, target: Path, pod_uid: str) -> None:
        self.node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(
            volume_id=volume_id_of(pod_uid), target_path=str(target)), timeout=10)

    def data_of(self, namespace: str, policy_uid: str) -> Path:
        return self.cfg.root / namespace / policy_uid / "data"

    def restart(self) -> None:
        """A new driver process (the DaemonSet's pod restarted) on the same
        sockets and root."""
        self.driver.stop(grace_s=1)
        self.driver = Driver(self.cfg, self.resolve, list_classes=self.list_classes)
        self.driver.start()


#: The driver bind-mounts volumes: its tests need Linux and root (as its
#: DaemonSet pod runs).
AS_ROOT_ON_LINUX = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0,
    reason="the driver bind-mounts volumes: Linux, as root (as its DaemonSet pod runs)")


def volume_id_of(pod_uid: str) -> str:
    # kubelet's inline volume ids are csi-<sha256 hex>; any stable id will do.
    return f"csi-{pod_uid.replace('-', '')}"


def new_pod_uid() -> str:
    return str(uuid.uuid4())


def mount_options(path: Path) -> list[set[str]]:
    """The per-mount options of each mount at `path` in /proc/self/mountinfo."""
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        return [set(line.split()[5].split(",")) for line in info
                if line.split()[4] == str(path)]


@contextmanager
def running_driver(resolve: PolicyResolver | None = None, list_classes: ClassLister | None = None,
                   storage_api: Any = None, **settings: Any) -> Iterator[Harness]:
    """A driver on its own sockets and root. The policy lookup is the
    harness's `policies` dict unless `resolve` is given (a real apiserver's);
    `list_classes` reads the CheckpointClasses (none: never read);
    `storage_api` publishes the free space (none: not published);
    `settings` replace DriverConfig fields (reclaim, scan_interval_s, ...)."""
    # Unix socket paths are limited to 108 bytes: a short directory of our own.
    base = Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))
    cfg = DriverConfig(
        name=NAME, node_id="node-a", root=base / "root", pods_dir=PurePosixPath(base / "pods"),
        csi_socket=base / "plugins" / NAME / "csi.sock",
        registration_socket=base / "registry" / f"{NAME}-reg.sock", owner_uid=65532)
    cfg = replace(cfg, **settings)
    policies: dict[tuple[str, str], str] = {}
    if resolve is None:
        def resolve(namespace: str, name: str) -> PolicyFound | None:
            uid = policies.get((namespace, name))
            return None if uid is None else PolicyFound(uid, None)
    driver = Driver(cfg, resolve, list_classes=list_classes, storage_api=storage_api)
    driver.start()
    channel = grpc.insecure_channel(f"unix://{cfg.csi_socket}")
    h = Harness(cfg, driver, policies, csi_pb2_grpc.NodeStub(channel),
                csi_pb2_grpc.IdentityStub(channel), resolve, list_classes=list_classes)
    try:
        yield h
    finally:
        channel.close()
        h.driver.stop(grace_s=1)
        for target in h.targets:
            while mounts.is_mount_point(target):
                mounts.unmount(target)
        shutil.rmtree(base)


def refused(call: Callable[..., object], *args: object, **kwargs: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, **kwargs)
    return caught.value
