"""The CSI driver's Prometheus metrics, read from the collector's latest
scan (so a policy's series goes when its directory does):

- `ckptdrain_csi_policy_used_bytes{namespace,policy,uid}` and
  `ckptdrain_csi_policy_used_inodes{...}`: each policy's node data;
- `ckptdrain_csi_filesystem_available_bytes` / `_size_bytes` (and
  `_available_inodes` / `_inodes`): the disk under the driver's root, as an
  unprivileged writer (the agent) sees it;
- `ckptdrain_csi_policy_dirs{state}`: policy directories by state (live,
  pending_deletion, retained, unknown_owner);
- `ckptdrain_csi_deletions_total`: directories of deleted policies removed;
- `ckptdrain_csi_last_scan_timestamp_seconds`: when the last scan ended (a
  stalled collector shows here; /healthz fails only once its thread has
  ended, as a slow apiserver makes a scan slow without anything wrong here);
- `ckptdrain_csi_scan_interval_seconds`: the interval it scans at, so an
  alert can count intervals since the last scan without knowing the config.

Labels are a policy's identity or a fixed set, never a path.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector as PrometheusCollector

from ckptdrain.csi.collection import Verdict
from ckptdrain.csi.collector import Collector

DIR_STATES = ("live", "pending_deletion", "retained", "unknown_owner")
_STATE_OF = {Verdict.LIVE: "live", Verdict.PENDING: "pending_deletion",
             Verdict.RETAINED: "retained"}


class _ScanMetrics(PrometheusCollector):
    def __init__(self, collector: Collector) -> None:
        self.collector = collector

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        report = self.collector.report
        labels = ["namespace", "policy", "uid"]
        used = GaugeMetricFamily("ckptdrain_csi_policy_used_bytes",
                                 "Disk space a policy's node data takes on this node",
                                 labels=labels)
        inodes = GaugeMetricFamily("ckptdrain_csi_policy_used_inodes",
                                   "Inodes a policy's node data takes on this node", labels=labels)
        states = dict.fromkeys(DIR_STATES, 0)
        for policy in report.policies:
            states[_STATE_OF[policy.verdict]] += 1
            if policy.usage is not None:
                key = [policy.namespace, policy.policy_name, policy.policy_uid]
                used.add_metric(key, policy.usage.bytes)
                inodes.add_metric(key, policy.usage.inodes)
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
        deletions = CounterMetricFamily("ckptdrain_csi_deletions",
                                        "Directories of deleted policies removed")
        deletions.add_metric([], self.collector.deletions)
        yield deletions
        interval = GaugeMetricFamily("ckptdrain_csi_scan_interval_seconds",
                                     "How often the driver scans its root (seconds)")
        interval.add_metric([], self.collector.interval_s)
        yield interval
        if report.capacity is not None:
            for name, value, what in (
                    ("available_bytes", report.capacity.available_bytes, "Bytes free"),
                    ("size_bytes", report.capacity.total_bytes, "Size in bytes"),
                    ("available_inodes", report.capacity.available_inodes, "Inodes free"),
                    ("inodes", report.capacity.total_inodes, "Inodes in all")):
                family = GaugeMetricFamily(f"ckptdrain_csi_filesystem_{name}",
                                           f"{what} of the filesystem under the driver's root "
                                           "(free: for a writer that is not root)")
                family.add_metric([], value)
                yield family
            scanned = GaugeMetricFamily("ckptdrain_csi_last_scan_timestamp_seconds",
                                        "When the driver last scanned its root (Unix)")
            scanned.add_metric([], report.at)
            yield scanned


def registry_for(collector: Collector) -> CollectorRegistry:
    """A registry of its own (no process-wide state) over `collector`."""
    registry = CollectorRegistry()
    registry.register(_ScanMetrics(collector))
    return registry
