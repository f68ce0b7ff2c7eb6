"""The CSI driver's Prometheus metrics, read from the collector's latest
scan (so a policy's series goes when its directory does):

- `ckptdrain_csi_started_timestamp_seconds`: when the driver started (an
  alert counts a stall from here until a first scan has ended);
- `ckptdrain_csi_scan_interval_seconds`: the interval it scans at, so an
  alert can count intervals since the last scan without knowing the config;
- `ckptdrain_csi_deletions_total`: directories of deleted policies removed.

Only once a first scan has ended (before, nothing is known: a zero would
read as "no unknown owners" and resolve their alert on each restart):

- `ckptdrain_csi_policy_used_bytes{namespace,policy,uid}` and
  `ckptdrain_csi_policy_used_inodes{...}`: each policy's node data;
- `ckptdrain_csi_filesystem_available_bytes` / `_size_bytes` (and
  `_available_inodes` / `_inodes`): the disk under the driver's root, as an
  unprivileged writer (the agent) sees it;
- `ckptdrain_csi_policy_dirs{state}`: policy directories by state (live,
  pending_deletion, retained, unknown_owner);
- `ckptdrain_csi_policy_dirs_used_bytes{state}`: what those of each state
  take (live, pending_deletion, retained: a directory of an unknown owner is
  not measured, as it is nobody's data to walk);
- `ckptdrain_csi_oldest_pending_deletion_timestamp_seconds`: when the owner
  of the longest-pending directory was first seen deleted; absent when
  nothing is pending;
- `ckptdrain_csi_earliest_pending_deletion_due_timestamp_seconds`: the
  earliest time a pending directory's deletion is due (first seen deleted
  plus its own grace: its class's, else the driver's), what the overdue
  alert counts from; absent when nothing is pending;
- `ckptdrain_csi_held_reclaim_records`: directories held at the last scan
  because their reclaim record cannot be read or parsed, or names a class
  whose reclaim was never read (never the driver's setting for them);
- `ckptdrain_csi_class_list_failed`: 1 when the last scan could not list
  the CheckpointClasses (nothing recorded changed), else 0;
- `ckptdrain_csi_last_scan_timestamp_seconds`: when the last scan ended (a
  stalled collector shows here; /healthz fails only once its thread has
  ended, as a slow apiserver makes a scan slow without anything wrong here).

Labels are a policy's identity or a fixed set, never a path.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector as PrometheusCollector

from ckptdrain.csi.collection import Verdict
from ckptdrain.csi.collector import Collector, ScanReport

DIR_STATES = ("live", "pending_deletion", "retained", "unknown_owner")
MEASURED_STATES = ("live", "pending_deletion", "retained")
_STATE_OF = {Verdict.LIVE: "live", Verdict.PENDING: "pending_deletion",
             Verdict.RETAINED: "retained"}

Family = GaugeMetricFamily | CounterMetricFamily


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], value)
    return family


class _ScanMetrics(PrometheusCollector):
    def __init__(self, collector: Collector) -> None:
        self.collector = collector

    def collect(self) -> Iterator[Family]:
        yield _gauge("ckptdrain_csi_started_timestamp_seconds",
                     "When the driver started (Unix)", self.collector.started_at)
        yield _gauge("ckptdrain_csi_scan_interval_seconds",
                     "How often the driver scans its root (seconds)", self.collector.interval_s)
        deletions = CounterMetricFamily("ckptdrain_csi_deletions",
                                        "Directories of deleted policies removed")
        deletions.add_metric([], self.collector.deletions)
        yield deletions
        report = self.collector.report
        if report is not None:
            yield from _scanned(report)


def _scanned(report: ScanReport) -> Iterator[Family]:
    """What the last scan found."""
    labels = ["namespace", "policy", "uid"]
    used = GaugeMetricFamily("ckptdrain_csi_policy_used_bytes",
                             "Disk space a policy's node data takes on this node", labels=labels)
    inodes = GaugeMetricFamily("ckptdrain_csi_policy_used_inodes",
                               "Inodes a policy's node data takes on this node", labels=labels)
    states = dict.fromkeys(DIR_STATES, 0)
    state_bytes = dict.fromkeys(MEASURED_STATES, 0)
    for policy in report.policies:
        state = _STATE_OF[policy.verdict]
        states[state] += 1
        if policy.usage is not None:
            key = [policy.namespace, policy.policy_name, policy.policy_uid]
            used.add_metric(key, policy.usage.bytes)
            inodes.add_metric(key, policy.usage.inodes)
            state_bytes[state] += policy.usage.bytes
    states["unknown_owner"] = report.unknown_owners
    yield used
    yield inodes
    dirs = GaugeMetricFamily("ckptdrain_csi_policy_dirs",
                             "Policy directories on this node by state: live, "
                             "pending_deletion (owner deleted, in its grace or published), "
                             "retained (owner deleted, reclaim Retain), unknown_owner (no "
                             "valid owner marker: kept, never handed out)", labels=["state"])
    for state, count in states.items():
        dirs.add_metric([state], count)
    yield dirs
    dirs_bytes = GaugeMetricFamily("ckptdrain_csi_policy_dirs_used_bytes",
                                   "Disk space the policy directories of each state take on "
                                   "this node (those of unknown owners are not measured)",
                                   labels=["state"])
    for state, total in state_bytes.items():
        dirs_bytes.add_metric([state], total)
    yield dirs_bytes
    oldest = report.oldest_pending_since()
    if oldest is not None:
        yield _gauge("ckptdrain_csi_oldest_pending_deletion_timestamp_seconds",
                     "When the owner of the longest-pending directory was first seen "
                     "deleted (Unix)", oldest)
    due = report.earliest_pending_due()
    if due is not None:
        yield _gauge("ckptdrain_csi_earliest_pending_deletion_due_timestamp_seconds",
                     "The earliest time a pending directory's deletion is due (Unix): "
                     "first seen deleted plus its own grace (its class's or the driver's)",
                     due)
    yield _gauge("ckptdrain_csi_held_reclaim_records",
                 "Directories held at the last scan: their reclaim record cannot be read "
                 "or names a class whose reclaim was never read", report.held_records)
    yield _gauge("ckptdrain_csi_class_list_failed",
                 "1 when the last scan could not list the CheckpointClasses, else 0",
                 float(report.class_list_failed))
    if report.capacity is not None:
        for name, value, what in (
                ("available_bytes", report.capacity.available_bytes, "Bytes free"),
                ("size_bytes", report.capacity.total_bytes, "Size in bytes"),
                ("available_inodes", report.capacity.available_inodes, "Inodes free"),
                ("inodes", report.capacity.total_inodes, "Inodes in all")):
            yield _gauge(f"ckptdrain_csi_filesystem_{name}",
                         f"{what} of the filesystem under the driver's root "
                         "(free: for a writer that is not root)", value)
    yield _gauge("ckptdrain_csi_last_scan_timestamp_seconds",
                 "When the driver last scanned its root (Unix)", report.at)


def registry_for(collector: Collector) -> CollectorRegistry:
    """A registry of its own (no process-wide state) over `collector`."""
    registry = CollectorRegistry()
    registry.register(_ScanMetrics(collector))
    return registry
