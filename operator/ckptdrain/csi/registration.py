"""kubelet's plugin registration, served by the driver itself.

kubelet watches its plugins-registry dir; for a new socket there it calls
GetInfo (type, name, the CSI endpoint, the CSI versions), connects to the
endpoint, and reports the outcome with NotifyRegistrationStatus. What
node-driver-registrar does in a sidecar, in a few lines: one process fewer
to trust, and a failed registration ends the driver (non-zero exit), so the
DaemonSet restarts it and the failure shows in its pod's status.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import grpc

from ckptdrain.csi.stubs import pluginregistration_pb2, pluginregistration_pb2_grpc

log = logging.getLogger(__name__)

CSI_PLUGIN = "CSIPlugin"  # kubelet's pluginregistration.CSIPlugin
# kubelet speaks CSI v1 to any plugin that lists a 1.x version.
SUPPORTED_VERSIONS = ("1.0.0",)


class Registration(pluginregistration_pb2_grpc.RegistrationServicer):
    """Answers kubelet; `failed` is set when kubelet reports a failure."""

    def __init__(self, name: str, csi_endpoint: str) -> None:
        self.name = name
        self.csi_endpoint = csi_endpoint
        self.registered = threading.Event()
        self.failed = threading.Event()
        self.failure = ""

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pluginregistration_pb2.PluginInfo(
            type=CSI_PLUGIN, name=self.name, endpoint=self.csi_endpoint,
            supported_versions=list(SUPPORTED_VERSIONS))

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.plugin_registered:
            log.info("kubelet registered CSI driver %s (endpoint %s)",
                     self.name, self.csi_endpoint)
            self.registered.set()
        else:
            self.failure = request.error or "(kubelet gave no reason)"
            log.error("kubelet did not register CSI driver %s: %s", self.name, self.failure)
            self.failed.set()
        return pluginregistration_pb2.RegistrationStatusResponse()
