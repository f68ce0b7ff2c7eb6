"""What the webhook and the CSI node driver must agree on: the driver's
default name (the CSIDriver object's, which injected volumes name) and the
lowest fsGroup the driver gives a policy's data (admission refuses lower
ones, so a pod never hangs on a mount the driver would refuse). Pure."""

from __future__ import annotations

DEFAULT_DRIVER_NAME = "node.ckptdrain.io"
#: System groups (Debian's 0-999) stay out; the agent's own gid, 65532, is above.
DEFAULT_MIN_MOUNT_GROUP = 1000
