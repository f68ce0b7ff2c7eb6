"""The driver's two gRPC servers on unix sockets: CSI (Identity, Node) for
kubelet's volume calls, and the registration socket kubelet discovers it by.
The CSI socket is up before the registration socket appears, so kubelet
never finds an endpoint that does not answer yet. Beside them: the
collector's scan of the root (collector.py) and its metrics endpoint.
"""

from __future__ import annotations

import os
import socket as sockets
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from ckptdrain.csi import capacity_report, mounts
from ckptdrain.csi.capacity_publisher import CapacityPublisher
from ckptdrain.csi.class_reclaim import ClassLister
from ckptdrain.csi.collector import Collector
from ckptdrain.csi.config import DriverConfig
from ckptdrain.csi.metrics import registry_for
from ckptdrain.csi.registration import Registration
from ckptdrain.csi.services import Identity, Node
from ckptdrain.csi.stubs import csi_pb2_grpc, pluginregistration_pb2_grpc
from ckptdrain.csi.volumes import Mounter, PolicyResolver, VolumeStore
from ckptdrain.metrics_endpoint import MetricsEndpoint


class LinuxMounter:
    """The real mount calls (mounts.py) as a volumes.Mounter."""

    bind = staticmethod(mounts.bind)
    unmount = staticmethod(mounts.unmount)
    is_mount_point = staticmethod(mounts.is_mount_point)


def _served(socket: Path) -> bool:
    """Whether a process accepts connections on the unix socket `socket`."""
    with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(socket))
        except OSError:
            return False
    return True


def _refuse_if_served(socket: Path) -> None:
    """Another driver on this node (a second release, a surge update, two
    nodes on one host) answering on `socket`: replacing its socket would take
    kubelet from it, and gRPC unlinks the path when that driver stops, so
    kubelet would lose ours. Exit instead; the DaemonSet retries."""
    if socket.is_socket() and _served(socket):
        raise OSError(f"another process serves {socket}: is a second CSI driver of "
                      "this name running on this node?")


def _listen(server: grpc.Server, socket: Path) -> None:
    socket.parent.mkdir(parents=True, exist_ok=True)
    _refuse_if_served(socket)
    if socket.is_socket():
        # A socket left by the previous run of the driver (a restart) is replaced.
        socket.unlink()
    # Only root (kubelet) may connect: a unix socket has no other auth. It is
    # made 0600 by the bind itself (the umask), not chmod'ed after: between
    # the two anyone could connect.
    previous = os.umask(0o177)
    try:
        bound = server.add_insecure_port(f"unix://{socket}")
    except RuntimeError as err:  # grpc's "Failed to bind"
        raise OSError(f"could not listen on unix socket {socket}: {err}") from err
    finally:
        os.umask(previous)
    if not bound:
        raise OSError(f"could not listen on unix socket {socket}")


class Driver:
    """Both servers, started and stopped together."""

    def __init__(self, cfg: DriverConfig, resolve_policy: PolicyResolver,
                 mounter: Mounter | None = None, list_classes: ClassLister | None = None,
                 storage_api: Any = None) -> None:
        """`storage_api`: a kubernetes StorageV1Api to publish the node's
        free space with, in cfg.capacity_namespace (None, or no namespace:
        not published)."""
        self.cfg = cfg
        cfg.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        self.volumes = VolumeStore(cfg.root, resolve_policy, mounter or LinuxMounter(),
                                   owner_uid=cfg.owner_uid)
        self.publisher = None if storage_api is None or not cfg.capacity_namespace else \
            CapacityPublisher(storage_api, cfg.capacity_namespace, cfg.node_id, cfg.name,
                              capacity_report.refresh_period(cfg.scan_interval_s),
                              owner=cfg.pod)
        self.collector = Collector(self.volumes, resolve_policy, cfg.reclaim,
                                   cfg.scan_interval_s, mounts.mounted_under,
                                   list_classes=list_classes, after_scan=self.publisher)
        self.metrics: MetricsEndpoint | None = None
        self.registration = Registration(cfg.name, str(cfg.csi_socket))
        self.csi = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        csi_pb2_grpc.add_IdentityServicer_to_server(Identity(cfg.name, cfg.root), self.csi)
        csi_pb2_grpc.add_NodeServicer_to_server(
            Node(cfg.node_id, self.volumes, self.collector, cfg.pods_dir, cfg.min_mount_group),
            self.csi)
        self.registrar = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
        pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(
            self.registration, self.registrar)

    def start(self) -> None:
        for socket in (self.cfg.csi_socket, self.cfg.registration_socket):
            _refuse_if_served(socket)
        # Only once no other driver runs here: its half-made dirs are not ours.
        self.volumes.clean_staging()
        if self.cfg.metrics_port:
            try:
                self.metrics = MetricsEndpoint(registry_for(self.collector),
                                               self.cfg.metrics_port, self.collector.alive,
                                               stalled="collector stopped")
            except OSError as err:
                raise OSError(f"could not serve metrics on port {self.cfg.metrics_port}: "
                              f"{err.strerror or err}") from err
            self.metrics.start()
        self.collector.start()
        _listen(self.csi, self.cfg.csi_socket)
        self.csi.start()
        _listen(self.registrar, self.cfg.registration_socket)
        self.registrar.start()

    def stop(self, grace_s: float = 5.0) -> None:
        # The registration socket goes first: kubelet deregisters the driver
        # when it disappears, before the CSI socket stops answering.
        self.registrar.stop(grace_s).wait()
        self.cfg.registration_socket.unlink(missing_ok=True)
        self.csi.stop(grace_s).wait()
        self.cfg.csi_socket.unlink(missing_ok=True)
        self.collector.stop()
        if self.metrics is not None:
            self.metrics.stop()
