"""`ckptdrain-local`, the node tier's volume in an injected pod: a hostPath
under the platform's root (prepared by the root `ckptdrain-prepare`,
admission/prepare.py), or, with CKPTDRAIN_NODE_TIER=csi, an ephemeral
inline volume of the ckptdrain CSI node driver, which Pod Security
`restricted` allows (docs/csi-driver.md), and the check of the pod's
fsGroup that the driver would otherwise make only at mount time. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptdrain.operator.policy.spec import Policy

#: The one attribute the driver accepts: a CheckpointPolicy of the pod's namespace.
CSI_POLICY_ATTRIBUTE = "policy"


def local_volume(policy: Policy, *, prepare: bool = True, reader: bool = False,
                 csi_driver: str | None = None) -> dict[str, Any]:
    """`ckptdrain-local`, the node tier. With a `csi_driver`, its inline
    volume: the driver looks the policy up in the pod's own namespace and
    prepares ownership (docs/csi-driver.md), read-only for a reader.
    Else the hostPath; without `prepare` (no root init container) the node
    must already hold the directory: "Directory" makes a missing one a clear
    mount error instead of a root-owned directory the agent cannot write."""
    if csi_driver is not None:
        csi: dict[str, Any] = {"driver": csi_driver,
                               "volumeAttributes": {CSI_POLICY_ATTRIBUTE: policy.name}}
        if reader:
            csi["readOnly"] = True
        return {"name": "ckptdrain-local", "csi": csi}
    return {"name": "ckptdrain-local",
            "hostPath": {"path": policy.node_path(),
                         "type": "DirectoryOrCreate" if prepare else "Directory"}}


def mount_group_problem(pod: Mapping[str, Any], min_group: int) -> str | None:
    """Why the CSI driver would refuse this pod's volume, or None. The driver
    refuses an fsGroup below its minimum (root's and system groups must not
    get write access to the data); kubelet then retries forever and the pod
    hangs in ContainerCreating, so admission refuses it first. A pod without
    an fsGroup gets ckptdrain's own (work_dir.SHARED_GROUP)."""
    group = ((pod.get("spec") or {}).get("securityContext") or {}).get("fsGroup")
    if group is None or (isinstance(group, int) and group >= min_group):
        return None
    return (f"spec.securityContext.fsGroup: {group!r} is below {min_group}, the lowest "
            "group the ckptdrain CSI driver gives the node tier's data to (system groups "
            "are refused); set a group id of at least that, or none")
