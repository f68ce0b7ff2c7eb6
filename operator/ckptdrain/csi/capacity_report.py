"""The driver's free space as the apiserver keeps it: one
`storage.k8s.io/v1` CSIStorageCapacity per node, in the driver's own
namespace, and when to write it again. Pure.

    apiVersion: storage.k8s.io/v1
    kind: CSIStorageCapacity
    metadata:
      name: node-tier-<driver hash>-<node>  (object_name: shortened, with a
                                         hash, when the node's name does not fit)
      namespace: <the driver's>
      ownerReferences: [<the driver's Pod>]  (when it is named: garbage-collected
                                         with it)
      labels: {ckptdrain.io/csi-driver: <driver name>}
      annotations: {ckptdrain.io/node: <node>,
                    ckptdrain.io/measured-at: <RFC 3339>,
                    ckptdrain.io/refresh-seconds: <refresh period>}
    storageClassName: ckptdrain-node-tier
    capacity: <bytes free for a non-root writer>
    maximumVolumeSize: <the same: one volume may take all of it>
    nodeTopology: {matchLabels: {kubernetes.io/hostname: <node>}}
                                        (only when the node's name is a valid
                                         label value)

A thousand nodes writing every scan would be a thousand writes a minute
for numbers nobody reads that often: a report is written again only when
the free space moved by at least THRESHOLD of the disk's size, or the last
write is a refresh period old (so a reader can tell a live report from a
dead node's).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ckptdrain.contract import api
from ckptdrain.contract.csi import (
    CAPACITY_ANNOTATION_MEASURED,
    CAPACITY_ANNOTATION_NODE,
    CAPACITY_ANNOTATION_REFRESH,
    CAPACITY_LABEL_DRIVER,
    CAPACITY_REFRESH_CAP_S,
    CAPACITY_STORAGE_CLASS,
)
from ckptdrain.csi.usage import Capacity

NAME_PREFIX = "node-tier-"
#: A DNS subdomain's longest name (the object's name must be one).
MAX_NAME = 253
HASH_CHARS = 10
DRIVER_HASH_CHARS = 6
#: A move of the free space worth a write: this share of the disk's size.
THRESHOLD = 0.01
#: The refresh period: REFRESH_SCANS scan intervals, at most
#: CAPACITY_REFRESH_CAP_S, at least MIN_REFRESH_SCANS.
REFRESH_SCANS = 10
MIN_REFRESH_SCANS = 2
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: A label value's longest: a longer node name gets no nodeTopology.
MAX_LABEL_VALUE = 63

_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def object_name(node: str, driver: str) -> str:
    """The report's name for `node` by the driver named `driver`:
    NAME_PREFIX, a short hash of the driver's name (two releases in one
    namespace never write one object), and the node's name when the whole
    is a DNS subdomain of at most MAX_NAME characters; otherwise the node's
    name cleaned to [a-z0-9-] and cut to fit, then a hash of the whole name
    (so two nodes never share a report)."""
    prefix = f"{NAME_PREFIX}{_digest(driver, DRIVER_HASH_CHARS)}-"
    whole = prefix + node
    if len(whole) <= MAX_NAME and _SUBDOMAIN.fullmatch(whole):
        return whole
    digest = _digest(node, HASH_CHARS)
    room = MAX_NAME - len(prefix) - 1 - HASH_CHARS
    readable = re.sub(r"[^a-z0-9]+", "-", node.lower())[:room].strip("-")
    return f"{prefix}{readable}-{digest}" if readable else f"{prefix}{digest}"


def _digest(text: str, chars: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:chars]


def refresh_period(scan_interval_s: float) -> float:
    """How old the last write may get before it is written again. Never
    under two scan intervals: a write waits for a scan, so a live report is
    up to a period and a scan old, and a reader allows two periods."""
    return max(min(REFRESH_SCANS * scan_interval_s, CAPACITY_REFRESH_CAP_S),
               MIN_REFRESH_SCANS * scan_interval_s)


def rfc3339(at: float) -> str:
    """`at` (Unix seconds) as every time the API carries (contract/api.py)."""
    return api.timestamp(datetime.fromtimestamp(at, UTC))


def build(node: str, driver: str, namespace: str, free: Capacity, measured_at: float,
          refresh_s: float, owner: tuple[str, str] | None = None) -> dict[str, Any]:
    """The CSIStorageCapacity reporting `free` on `node`, measured at
    `measured_at` (Unix seconds); `owner`: the driver's own Pod (name, uid),
    in `namespace`, whose deletion takes the report with it."""
    available = str(max(free.available_bytes, 0))
    report: dict[str, Any] = {
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacity",
        "metadata": {
            "name": object_name(node, driver), "namespace": namespace,
            "labels": {CAPACITY_LABEL_DRIVER: driver},
            "annotations": {CAPACITY_ANNOTATION_NODE: node,
                            CAPACITY_ANNOTATION_MEASURED: rfc3339(measured_at),
                            CAPACITY_ANNOTATION_REFRESH: f"{refresh_s:g}"}},
        "storageClassName": CAPACITY_STORAGE_CLASS,
        "capacity": available,
        "maximumVolumeSize": available,
    }
    if owner is not None:
        # No blockOwnerDeletion: that would need a right on the Pod's finalizers.
        report["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": owner[0], "uid": owner[1]}]
    if len(node) <= MAX_LABEL_VALUE and _LABEL_VALUE.fullmatch(node):
        report["nodeTopology"] = {"matchLabels": {HOSTNAME_LABEL: node}}
    return report


@dataclass(frozen=True)
class Written:
    """What was last written: the free space and when."""

    available_bytes: int
    at: float


def due(last: Written | None, free: Capacity, now: float, refresh_s: float) -> bool:
    """Whether `free`, measured at `now`, is worth writing after `last`
    (None: nothing written yet by this driver run)."""
    if last is None or now - last.at >= refresh_s:
        return True
    return abs(free.available_bytes - last.available_bytes) >= THRESHOLD * free.total_bytes
