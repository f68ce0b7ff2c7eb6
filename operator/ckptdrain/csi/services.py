"""CSI's Identity and Node services: thin gRPC edges over requests.py and
volumes.py. Each call reads the message, calls the core, and turns a
`Refused` into the status code it names (an OSError into INTERNAL, with the
path and the system's reason, never a volume attribute's value).

Only what the node tier needs is served: no Controller service (volumes are
inline, made on the node), no staging; NodeGetCapabilities offers
VOLUME_MOUNT_GROUP so that kubelet passes the pod's fsGroup to the driver
instead of changing ownership itself, and GET_VOLUME_STATS: a volume's
usage is its policy's data (measured at the collector's last scan), its
available and total the disk's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

import grpc
from google.protobuf import wrappers_pb2

from ckptdrain import __version__
from ckptdrain.csi.collector import Collector
from ckptdrain.csi.requests import Refused, check_volume_id, publish_request, unpublish_request
from ckptdrain.csi.stubs import csi_pb2, csi_pb2_grpc
from ckptdrain.csi.usage import capacity
from ckptdrain.csi.volumes import VolumeStore

log = logging.getLogger(__name__)
T = TypeVar("T")


def answer(context: grpc.ServicerContext, call: str, work: Callable[[], T]) -> T:
    """Run `work`; a refusal or an OS error ends the call with its status."""
    try:
        return work()
    except Refused as refused:
        log.warning("%s refused (%s): %s", call, refused.code, refused.message)
        context.abort(grpc.StatusCode[refused.code], refused.message)
    except OSError as err:
        message = f"{err.strerror or err}: {err.filename}" if err.filename else str(err)
        log.error("%s failed: %s", call, message)
        context.abort(grpc.StatusCode.INTERNAL, message)
    raise AssertionError("context.abort returns only by raising")


class Identity(csi_pb2_grpc.IdentityServicer):
    def __init__(self, name: str, root: os.PathLike[str] | str) -> None:
        self.name = name
        self.root = root

    def GetPluginInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return csi_pb2.GetPluginInfoResponse(name=self.name, vendor_version=__version__)

    def GetPluginCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        # No CONTROLLER_SERVICE: every volume is made on the node.
        return csi_pb2.GetPluginCapabilitiesResponse()

    def Probe(self, request: Any, context: grpc.ServicerContext) -> Any:
        # Ready when the data root is there to write in.
        ready = os.path.isdir(self.root) and os.access(self.root, os.W_OK | os.X_OK)
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=ready))


class Node(csi_pb2_grpc.NodeServicer):
    def __init__(self, node_id: str, volumes: VolumeStore, collector: Collector,
                 pods_dir: PurePosixPath, min_mount_group: int) -> None:
        self.node_id = node_id
        self.volumes = volumes
        self.collector = collector
        self.pods_dir = pods_dir
        self.min_mount_group = min_mount_group

    def NodeGetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return csi_pb2.NodeGetInfoResponse(node_id=self.node_id)

    def NodeGetCapabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        rpc = csi_pb2.NodeServiceCapability.RPC
        return csi_pb2.NodeGetCapabilitiesResponse(capabilities=[
            csi_pb2.NodeServiceCapability(rpc=rpc(type=rpc.VOLUME_MOUNT_GROUP)),
            csi_pb2.NodeServiceCapability(rpc=rpc(type=rpc.GET_VOLUME_STATS))])

    def NodePublishVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        def work() -> Any:
            capability = request.volume_capability
            if not capability.HasField("mount"):
                raise Refused("INVALID_ARGUMENT", "volume_capability: expected a mount "
                              "(a filesystem volume), got a block volume or none")
            req = publish_request(
                request.volume_id, request.target_path, dict(request.volume_context),
                request.readonly, capability.mount.volume_mount_group, self.pods_dir,
                self.min_mount_group)
            self.volumes.publish(req)
            return csi_pb2.NodePublishVolumeResponse()

        return answer(context, "NodePublishVolume", work)

    def NodeUnpublishVolume(self, request: Any, context: grpc.ServicerContext) -> Any:
        def work() -> Any:
            req = unpublish_request(request.volume_id, request.target_path, self.pods_dir)
            self.volumes.unpublish(req)
            return csi_pb2.NodeUnpublishVolumeResponse()

        return answer(context, "NodeUnpublishVolume", work)

    def NodeGetVolumeStats(self, request: Any, context: grpc.ServicerContext) -> Any:
        def work() -> Any:
            check_volume_id(request.volume_id)
            if not request.volume_path:
                raise Refused("INVALID_ARGUMENT", "volume_path: expected the path the volume "
                              "is published at, got nothing")
            source = self.volumes.published_source(request.volume_id,
                                                   Path(request.volume_path))
            if source is None:
                raise Refused("NOT_FOUND", f"volume {request.volume_id!r} is not published "
                              f"at volume_path {request.volume_path!r}")
            used = self.collector.usage_of(source.parent)
            disk = capacity(source)
            unit = csi_pb2.VolumeUsage
            return csi_pb2.NodeGetVolumeStatsResponse(usage=[
                unit(unit=unit.BYTES, used=used.bytes, available=disk.available_bytes,
                     total=disk.total_bytes),
                unit(unit=unit.INODES, used=used.inodes, available=disk.available_inodes,
                     total=disk.total_inodes)])

        return answer(context, "NodeGetVolumeStats", work)
