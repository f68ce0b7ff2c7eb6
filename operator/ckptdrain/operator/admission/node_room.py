"""Whether any node has room for one writer of a policy, from the free
space the CSI drivers report (csi/capacity_report.py: one
CSIStorageCapacity per node in the release namespace). Pure.

A policy admission in CSI mode warns, and never refuses, when fresh
reports exist and none has room for what one writer keeps on its node:
`spec.localTier.capacity` when set, else the checkpoint shards the agent
keeps without it (keep + 3 with the work dir on the tier's disk, keep + 2
with localTier.memory). Free
space moves between the report and the pod, and a policy's own data
already on a node (a policy created again, its old steps pruned as new
ones come) is room the report counts as used: a warning is all the
numbers can carry. No fresh report (hostPath mode, the driver off, every
report stale) says nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ckptdrain import units
from ckptdrain.contract.api import parse_timestamp
from ckptdrain.contract.csi import (
    CAPACITY_ANNOTATION_MEASURED,
    CAPACITY_ANNOTATION_NODE,
    CAPACITY_ANNOTATION_REFRESH,
    CAPACITY_MAX_REFRESH_S,
    CAPACITY_REFRESH_CAP_S,
    CAPACITY_STALE_PERIODS,
    CAPACITY_STORAGE_CLASS,
)
from ckptdrain.contract.tier_reserve import reserve_steps
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import spec as pol

#: The refresh period assumed of a report that does not say its own (the
#: driver's longest at its usual ten scans); one said over
#: CAPACITY_MAX_REFRESH_S is cut to that.
DEFAULT_REFRESH_S = CAPACITY_REFRESH_CAP_S
#: How far ahead of the operator's clock a report's measured-at may be and
#: still count (clock skew between nodes): further ahead, it is not fresh,
#: or a driver's fast clock would keep its report fresh for ever.
FUTURE_SKEW_S = 60.0
CAPACITY_FIELD = "spec.localTier.capacity"
SIZING_FIELDS = "spec.localTier.keep and shard size"


@dataclass(frozen=True)
class Report:
    node: str
    available_bytes: int
    measured_at: float  # Unix seconds
    refresh_s: float


#: Shards one writer keeps beyond `keep` without spec.localTier.capacity,
#: as the agent sizes the tier (docs/pod-contract.md "Where the work dir
#: lives"): the step being captured, and the steps a scheduled capture keeps
#: free (contract/tier_reserve.py, which the agent sizes by too, so the two never
#: drift): the SIGTERM capture's, and with the trainer's work dir on the
#: tier's disk its next save's. keep + 3 with the work dir on the disk,
#: keep + 2 with localTier.memory.
EXTRA_SHARDS_DISK_WORK_DIR = 1 + reserve_steps(1, None, 0, work_on_disk=True)
EXTRA_SHARDS_MEMORY_WORK_DIR = 1 + reserve_steps(1, None, 0, work_on_disk=False)
#: The longest node name a warning repeats (a report's name is the driver's
#: to write), so that the warning, which kubectl prints on every write of the
#: policy, stays within WARNING_CHARS.
SHOWN_NODE_CHARS = 20
WARNING_CHARS = 200


@dataclass(frozen=True)
class Need:
    """What one writer keeps on its node, the field that says so, and the
    checkpoint shards counted when no capacity is set."""

    bytes: int
    field: str
    shards: int | None = None
    extra: int = 0
    work_dir_on_disk: bool = False


def report_of(obj: Mapping[str, Any]) -> Report | None:
    """The report a CSIStorageCapacity object makes, or None when it is not
    one of the driver's (another storage class) or does not read."""
    if obj.get("storageClassName") != CAPACITY_STORAGE_CLASS:
        return None
    meta = obj.get("metadata") or {}
    notes = meta.get("annotations") or {}
    try:
        available = units.parse_bytes("capacity", obj.get("capacity"))
        measured = parse_timestamp(str(notes.get(CAPACITY_ANNOTATION_MEASURED))).timestamp()
        refresh = float(notes.get(CAPACITY_ANNOTATION_REFRESH, DEFAULT_REFRESH_S))
    except (InvalidInput, ValueError, TypeError):
        return None
    if not refresh > 0:
        refresh = DEFAULT_REFRESH_S
    node = str(notes.get(CAPACITY_ANNOTATION_NODE) or meta.get("name") or "")
    return Report(node, available, measured, refresh)


def fresh(reports: Iterable[Report], now: float) -> list[Report]:
    """The reports measured within CAPACITY_STALE_PERIODS of their refresh period
    (at most CAPACITY_MAX_REFRESH_S), and not more than FUTURE_SKEW_S
    ahead of `now`."""
    return [r for r in reports
            if -FUTURE_SKEW_S <= now - r.measured_at
            <= CAPACITY_STALE_PERIODS * min(r.refresh_s, CAPACITY_MAX_REFRESH_S)]


def need_of(spec: Mapping[str, Any], namespace: str, name: str,
            cfg: OperatorConfig) -> Need | None:
    """What one writer of a policy of `spec` keeps on its node; None when
    the spec does not parse (validation says why, elsewhere)."""
    try:
        policy = pol.parse(namespace, name, dict(spec), cfg)
    except InvalidInput:
        return None
    if policy.local_capacity is not None:
        return Need(policy.local_capacity, CAPACITY_FIELD)
    on_disk = policy.memory_limit is None
    extra = EXTRA_SHARDS_DISK_WORK_DIR if on_disk else EXTRA_SHARDS_MEMORY_WORK_DIR
    shards = policy.local_keep + extra
    return Need(round(shards * policy.checkpoint_bytes / policy.writers), SIZING_FIELDS,
                shards, extra, on_disk)


def warning(need: Need, reports: Iterable[Report], now: float) -> str | None:
    """The admission warning when fresh reports exist and none has room
    for `need`; None otherwise (room somewhere, or nothing fresh to judge
    by)."""
    live = fresh(reports, now)
    if not live or any(r.available_bytes >= need.bytes for r in live):
        return None
    largest = max(live, key=lambda r: (r.available_bytes, r.node))
    most = f"{units.format_bytes(largest.available_bytes, units.DOWN)}"
    nodes = (f"the 1 node reporting has {most} free" if len(live) == 1 else
             f"{len(live)} nodes report at most {most} free")
    counted = ("" if need.shards is None else
               f" (keep + {need.extra} = {need.shards} shards"
               f"{', work dir on disk' if need.work_dir_on_disk else ''})")
    return (f"ckptdrain: {need.field}: a writer keeps up to "
            f"{units.format_bytes(need.bytes, units.UP)}{counted}; {nodes} "
            f"({shown(largest.node)}); admitted anyway")


def shown(node: str) -> str:
    """A node's name as a warning may repeat it: printable, and short."""
    printable = "".join(c for c in node if c.isprintable())
    return (printable if len(printable) <= SHOWN_NODE_CHARS
            else printable[:SHOWN_NODE_CHARS - 3] + "...")
