"""Whether any node has room for one writer of a policy, from the free
space the CSI drivers report (csi/capacity_report.py: one
CSIStorageCapacity per node in the release namespace). Pure.

A policy admission in CSI mode warns, and never refuses, when fresh
reports exist and none has room for what one writer keeps on its node:
`spec.localTier.capacity` when set, else (keep + 1) checkpoint shards. Free
space moves between the report and the pod, and a policy's own data
already on a node (a policy created again, its old steps pruned as new
ones come) is room the report counts as used: a warning is all the
numbers can carry. No fresh report (hostPath mode, the driver off, every
report stale) says nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ckptdrain import units
from ckptdrain.contract.csi import (
    CAPACITY_ANNOTATION_MEASURED,
    CAPACITY_ANNOTATION_NODE,
    CAPACITY_ANNOTATION_REFRESH,
    CAPACITY_STORAGE_CLASS,
)
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import spec as pol

#: A report is stale once this many of its driver's refresh periods old:
#: the driver writes at least once a period, so a live node's report is
#: never older than one (and the scan it measured).
STALE_PERIODS = 2
#: The refresh period assumed of a report that does not say its own (the
#: driver's longest).
DEFAULT_REFRESH_S = 3600.0
CAPACITY_FIELD = "spec.localTier.capacity"
SIZING_FIELDS = "spec.localTier.keep and the checkpoint's size"


@dataclass(frozen=True)
class Report:
    node: str
    available_bytes: int
    measured_at: float  # Unix seconds
    refresh_s: float


@dataclass(frozen=True)
class Need:
    """What one writer keeps on its node, and the field that says so."""

    bytes: int
    field: str


def report_of(obj: Mapping[str, Any]) -> Report | None:
    """The report a CSIStorageCapacity object makes, or None when it is not
    one of the driver's (another storage class) or does not read."""
    if obj.get("storageClassName") != CAPACITY_STORAGE_CLASS:
        return None
    meta = obj.get("metadata") or {}
    notes = meta.get("annotations") or {}
    try:
        available = units.parse_bytes("capacity", obj.get("capacity"))
        measured = datetime.fromisoformat(
            str(notes.get(CAPACITY_ANNOTATION_MEASURED)).replace("Z", "+00:00")).timestamp()
        refresh = float(notes.get(CAPACITY_ANNOTATION_REFRESH, DEFAULT_REFRESH_S))
    except (InvalidInput, ValueError, TypeError):
        return None
    if not refresh > 0:
        refresh = DEFAULT_REFRESH_S
    node = str(notes.get(CAPACITY_ANNOTATION_NODE) or meta.get("name") or "")
    return Report(node, available, measured, refresh)


def fresh(reports: Iterable[Report], now: float) -> list[Report]:
    """The reports measured within STALE_PERIODS of their refresh period."""
    return [r for r in reports if now - r.measured_at <= STALE_PERIODS * r.refresh_s]


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
    shard = policy.checkpoint_bytes / policy.writers
    return Need(round((policy.local_keep + 1) * shard), SIZING_FIELDS)


def warning(need: Need, reports: Iterable[Report], now: float) -> str | None:
    """The admission warning when fresh reports exist and none has room
    for `need`; None otherwise (room somewhere, or nothing fresh to judge
    by)."""
    live = fresh(reports, now)
    if not live or any(r.available_bytes >= need.bytes for r in live):
        return None
    largest = max(live, key=lambda r: (r.available_bytes, r.node))
    nodes = "node" if len(live) == 1 else "nodes"
    kept = ("" if need.field == CAPACITY_FIELD
            else " ((keep + 1) checkpoint shards: spec.localTier.capacity is not set)")
    return (f"ckptdrain: {need.field}: one writer keeps up to "
            f"{units.format_bytes(need.bytes, units.UP)} on its node{kept}, more than the "
            f"CSI driver reports free on any of {len(live)} {nodes} (the most: "
            f"{units.format_bytes(largest.available_bytes, units.DOWN)} on {largest.node}); "
            "its pods may fail to save to the node tier. Admitted: free space changes, and "
            "this policy's own data already on a node counts as room")
