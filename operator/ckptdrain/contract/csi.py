"""What the webhook and the CSI node driver must agree on: the driver's
default name (the CSIDriver object's, which injected volumes name) and the
lowest fsGroup the driver gives a policy's data (admission refuses lower
ones, so a pod never hangs on a mount the driver would refuse). Pure."""

from __future__ import annotations

DEFAULT_DRIVER_NAME = "node.ckptdrain.io"
#: System groups (Debian's 0-999) stay out; the agent's own gid, 65532, is above.
DEFAULT_MIN_MOUNT_GROUP = 1000

# -- The driver's free space, published for admission (docs/csi-driver.md,
# "Free space for admission"): one storage.k8s.io/v1 CSIStorageCapacity per
# node in the driver's own namespace, which the operator lists there.

#: The storageClassName every report carries. No StorageClass of this name
#: exists or is needed: the driver's volumes are inline, and the field only
#: says what the number is the room of.
CAPACITY_STORAGE_CLASS = "ckptdrain-node-tier"
#: Label on each report, naming the driver that wrote it (what the operator
#: lists by).
CAPACITY_LABEL_DRIVER = "ckptdrain.io/csi-driver"
#: Annotations on each report: the full node name (the object's name may be
#: shortened), when the free space was measured (RFC 3339, UTC), and the
#: driver's refresh period in seconds (a report older than twice that is stale).
CAPACITY_ANNOTATION_NODE = "ckptdrain.io/node"
CAPACITY_ANNOTATION_MEASURED = "ckptdrain.io/measured-at"
CAPACITY_ANNOTATION_REFRESH = "ckptdrain.io/refresh-seconds"
#: A report is stale once this many of its driver's refresh periods old.
#: The driver writes one at least once a period, after a scan, so a live
#: node's is at most a period and a scan interval old: the driver keeps its
#: period at least a scan interval (capacity_report.refresh_period).
CAPACITY_STALE_PERIODS = 2
#: The refresh period a driver writes: ten scan intervals, at most this
#: (and at least two scan intervals, however long: any scan interval works).
CAPACITY_REFRESH_CAP_S = 3600.0
#: The longest refresh period a reader believes: a report claiming a longer
#: one (an absurd value, NaN, infinity) is judged by this one, so it never
#: stays fresh for ever. A driver scanning more than every 12 hours writes
#: a longer period: its report then looks stale between scans (says nothing).
CAPACITY_MAX_REFRESH_S = 86400.0
