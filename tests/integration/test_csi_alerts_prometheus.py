"""The CSI node driver's alerts against a real Prometheus scraping real drivers.

Two drivers run as on two nodes, each with a small tmpfs of its own as its
root (a real disk that can be nearly full). On node-a someone left a
directory without an owner marker, and its data fills most of the disk; on
node-b a pod published a policy's volume and wrote a little. A real
Prometheus scrapes both (labelled as the chart's PodMonitor labels them:
node, pod and the driver's job) and evaluates the PrometheusRule the chart
renders, thresholds made small through its values. The test reads what
fires from Prometheus' HTTP API (`ALERTS`) and asks it for node-b's side of
each expression directly. Then node-a's scans stop (the stall alert fires),
and then its driver (the driver-down alert fires).

A second test deletes policies: on node-a (reclaim Delete) one whose volume
a pod still mounts, which stays past the threshold (overdue fires), and one
that goes on time; on node-b (reclaim Retain) one whose data takes half the
disk (retained data piling up fires). Waits poll with a cap; nothing
asserts on how long anything took.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support import prometheus
from tests.support.csi_driver import (
    AS_ROOT_ON_LINUX,
    UID_A,
    UID_A2,
    UID_B,
    Harness,
    new_pod_uid,
    running_driver,
)
from tests.support.s3servers import free_port
from tests.support.smallfs import small_filesystem

from ckptdrain.csi.collection import DELETE, RETAIN, Reclaim
from ckptdrain.csi.collector import DELETED_SINCE_FILE, read_clock

pytestmark = AS_ROOT_ON_LINUX

JOB = "ckptdrain-csi-node"  # the DaemonSet's name for release ckptdrain: the chart's job
SCAN_INTERVAL_S = 0.5
STALLED_INTERVALS = 20
MIB = 1024 * 1024
HELM_ARGS = (*prometheus.CSI_ON,
             "--set-json", "metrics.prometheusRule.csiDriver.diskFreeRatio=0.5",
             "--set", "metrics.prometheusRule.csiDriver.diskFullFor=0s",
             "--set", "metrics.prometheusRule.csiDriver.unknownOwnersFor=0s",
             "--set", f"metrics.prometheusRule.csiDriver.scanStalledIntervals="
                      f"{STALLED_INTERVALS}",
             "--set", "metrics.prometheusRule.csiDriver.driverDownFor=0s")


@pytest.fixture
def rules() -> dict[str, Any]:
    try:
        prometheus.binary("prometheus")
        return prometheus.chart_rules(*HELM_ARGS, template=prometheus.CSI_RULES)
    except prometheus.MissingBinaries as err:
        pytest.fail(str(err), pytrace=False)


@contextlib.contextmanager
def _drivers(tmp_path: Path, reclaims: dict[str, Reclaim | None]
             ) -> Iterator[dict[str, Harness]]:
    """{node name: its driver}, each on a 16 MiB tmpfs of its own, with its
    reclaim setting (None: the default)."""
    with contextlib.ExitStack() as stack:
        drivers = {}
        for node, reclaim in reclaims.items():
            root = stack.enter_context(small_filesystem(tmp_path / node, "16m"))
            settings = {} if reclaim is None else {"reclaim": reclaim}
            drivers[node] = stack.enter_context(running_driver(
                root=root, node_id=node, scan_interval_s=SCAN_INTERVAL_S,
                metrics_port=free_port(), **settings))
        yield drivers


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[dict[str, Harness]]:
    with _drivers(tmp_path, {"node-a": None, "node-b": None}) as drivers:
        yield drivers


def _plant_unknown_owner(h: Harness, size: int) -> Path:
    """A directory in the driver's layout with no owner.json: copied in by hand."""
    directory = h.cfg.root / "ml" / str(uuid.uuid4())
    (directory / "data").mkdir(parents=True)
    (directory / "data" / "step-7.bin").write_bytes(b"z" * size)
    return directory


def _publish_and_write(h: Harness, size: int, policy: str = "ckpt", uid: str = UID_A,
                       keep_mounted: bool = False) -> None:
    h.policies[("ml", policy)] = uid
    pod = new_pod_uid()
    target = h.target(pod)
    h.publish(target, "ml", pod, policy=policy)
    (target / "step-1.bin").write_bytes(b"x" * size)
    if not keep_mounted:
        h.unpublish(target, pod)


def _firing(prom: prometheus.Prometheus) -> set[tuple[str, str]]:
    return {(r["metric"]["alertname"], r["metric"].get("node", ""))
            for r in prom.query('ALERTS{alertstate="firing"}')}


def _nodes_of(prom: prometheus.Prometheus, rules: dict[str, Any], alert: str) -> set[str]:
    expr = next(str(r["expr"]) for g in rules["groups"] for r in g["rules"]
                if r.get("alert") == alert)
    return {r["metric"].get("node", "") for r in prom.query(expr)}


def test_node_tier_alerts_fire_for_the_troubled_node_and_not_the_healthy_one(
        tmp_path: Path, rules: dict[str, Any], nodes: dict[str, Harness]) -> None:
    troubled, healthy = nodes["node-a"], nodes["node-b"]
    unknown = _plant_unknown_owner(troubled, 13 * MIB)
    _publish_and_write(healthy, MIB)
    targets = [prometheus.Target(f"127.0.0.1:{h.cfg.metrics_port}",
                                 {"node": node, "pod": f"csi-{node}", "job": JOB})
               for node, h in nodes.items()]
    with prometheus.running(tmp_path / "prometheus", targets, rule_groups=rules) as prom:
        prom.wait_for_scrape()

        prom.wait_for_every_rule_evaluated()

        # The directory without a marker: counted, kept, and alerted on.
        prom.wait_for("CkptdrainNodeTierUnknownOwners for node-a",
                      lambda: ("CkptdrainNodeTierUnknownOwners", "node-a") in _firing(prom))
        (alert,) = prom.query('ALERTS{alertname="CkptdrainNodeTierUnknownOwners"}')
        assert alert["metric"]["severity"] == "warning"
        assert (unknown / "data" / "step-7.bin").stat().st_size == 13 * MIB
        # Its data leaves under half the disk free: the threshold set for the test.
        prom.wait_for("CkptdrainNodeTierDiskNearlyFull for node-a",
                      lambda: ("CkptdrainNodeTierDiskNearlyFull", "node-a") in _firing(prom))
        (free,) = prom.query('ckptdrain_csi_filesystem_available_bytes{node="node-a"}'
                             ' / ckptdrain_csi_filesystem_size_bytes{node="node-a"}')
        assert float(free["value"][1]) < 0.5

        # node-b's live policy data is seen, and none of its expressions has a value.
        assert prom.query('ckptdrain_csi_policy_dirs{node="node-b",state="live"} == 1')
        assert prom.query('ckptdrain_csi_policy_used_bytes{node="node-b"} >= 1048576')
        for rule in (r for g in rules["groups"] for r in g["rules"]):
            assert "node-b" not in _nodes_of(prom, rules, rule["alert"]), rule["alert"]
        assert not [a for a in _firing(prom) if a[1] == "node-b"], _firing(prom)
        assert ("CkptdrainNodeTierScanStalled", "node-a") not in _firing(prom)

        # node-a's scans stop (its endpoint still answers, with the old scan's time).
        troubled.driver.collector.stop()
        prom.wait_for("CkptdrainNodeTierScanStalled for node-a",
                      lambda: ("CkptdrainNodeTierScanStalled", "node-a") in _firing(prom))
        # ...then the whole driver: its scrape fails.
        troubled.driver.stop(grace_s=1)
        prom.wait_for("CkptdrainNodeTierDriverDown for node-a",
                      lambda: ("CkptdrainNodeTierDriverDown", "node-a") in _firing(prom))
        (down,) = prom.query('ALERTS{alertname="CkptdrainNodeTierDriverDown",'
                             'alertstate="firing"}')
        assert (down["metric"]["severity"], down["metric"]["pod"]) == ("critical", "csi-node-a")
        assert not [a for a in _firing(prom) if a[1] == "node-b"], _firing(prom)


GRACE = "2s"  # the drivers' reclaim grace, and the chart's csiDriver.reclaim.gracePeriod
OVERDUE = "CkptdrainNodeTierDeletionOverdue"
RETAINED = "CkptdrainNodeTierRetainedPiling"


def test_a_deletion_held_by_a_mount_is_overdue_and_retained_data_piles_up(
        tmp_path: Path) -> None:
    try:
        prometheus.binary("prometheus")
        rules = prometheus.chart_rules(
            *prometheus.CSI_ON, "--set", f"csiDriver.reclaim.gracePeriod={GRACE}",
            "--set", f"csiDriver.scanInterval={int(SCAN_INTERVAL_S * 1000)}ms",
            # Well past the grace and two scans (the chart refuses less), so
            # a deletion on time never reaches it even on a slow machine.
            "--set", "metrics.prometheusRule.csiDriver.deletionOverdueAfter=12s",
            "--set-json", "metrics.prometheusRule.csiDriver.retainedDiskRatio=0.3",
            template=prometheus.CSI_RULES)
    except prometheus.MissingBinaries as err:
        pytest.fail(str(err), pytrace=False)
    reclaims: dict[str, Reclaim | None] = {"node-a": Reclaim(DELETE, 2.0),
                                           "node-b": Reclaim(RETAIN, 2.0)}
    with _drivers(tmp_path, reclaims) as nodes:
        deleting, retaining = nodes["node-a"], nodes["node-b"]
        _publish_and_write(deleting, MIB, policy="held", uid=UID_A, keep_mounted=True)
        _publish_and_write(deleting, MIB, policy="gone", uid=UID_B)
        _publish_and_write(retaining, 8 * MIB, policy="kept", uid=UID_A2)
        for h in nodes.values():
            h.policies.clear()  # every policy deleted
        targets = [prometheus.Target(f"127.0.0.1:{h.cfg.metrics_port}",
                                     {"node": node, "pod": f"csi-{node}", "job": JOB})
                   for node, h in nodes.items()]
        with prometheus.running(tmp_path / "prometheus", targets, rule_groups=rules) as prom:
            prom.wait_for_scrape()
            prom.wait_for(f"{OVERDUE} for node-a",
                          lambda: (OVERDUE, "node-a") in _firing(prom))
            # The one nothing held went on time; the mounted one is kept,
            # and the alert ages it from its due time (first sighting + grace).
            assert not (deleting.cfg.root / "ml" / UID_B).exists()
            held = deleting.cfg.root / "ml" / UID_A
            clock = read_clock(held)
            assert clock is not None and (held / DELETED_SINCE_FILE).is_file()
            (oldest,) = prom.query('ckptdrain_csi_oldest_pending_deletion_timestamp_seconds'
                                   '{node="node-a"}')
            assert abs(float(oldest["value"][1]) - clock.since) < 0.01
            # What the alert counts from: the sighting plus the directory's grace.
            (due,) = prom.query('ckptdrain_csi_earliest_pending_deletion_due_timestamp_seconds'
                                '{node="node-a"}')
            assert abs(float(due["value"][1]) - (clock.since + 2.0)) < 0.01
            prom.wait_for(f"{RETAINED} for node-b",
                          lambda: (RETAINED, "node-b") in _firing(prom))
            (alert,) = prom.query(f'ALERTS{{alertname="{RETAINED}",alertstate="firing"}}')
            assert alert["metric"]["severity"] == "info"
            assert (retaining.cfg.root / "ml" / UID_A2 / "data" / "step-1.bin").is_file()
            # Each fires only where it should: retained data is not pending
            # deletion, and pending data is not retained.
            assert _nodes_of(prom, rules, OVERDUE) == {"node-a"}
            assert _nodes_of(prom, rules, RETAINED) == {"node-b"}
