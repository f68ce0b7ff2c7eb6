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
and then its driver (the driver-down alert fires). Waits poll with a cap;
nothing asserts on how long anything took.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support import prometheus
from tests.support.csi_driver import AS_ROOT_ON_LINUX, UID_A, Harness, new_pod_uid, running_driver
from tests.support.s3servers import free_port
from tests.support.smallfs import small_filesystem

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


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[dict[str, Harness]]:
    """{node name: its driver}, each on a 16 MiB tmpfs of its own."""
    with contextlib.ExitStack() as stack:
        drivers = {}
        for node in ("node-a", "node-b"):
            root = stack.enter_context(small_filesystem(tmp_path / node, "16m"))
            drivers[node] = stack.enter_context(running_driver(
                root=root, node_id=node, scan_interval_s=SCAN_INTERVAL_S,
                metrics_port=free_port()))
        yield drivers


def _plant_unknown_owner(h: Harness, size: int) -> Path:
    """A directory in the driver's layout with no owner.json: copied in by hand."""
    directory = h.cfg.root / "ml" / str(uuid.uuid4())
    (directory / "data").mkdir(parents=True)
    (directory / "data" / "step-7.bin").write_bytes(b"z" * size)
    return directory


def _publish_and_write(h: Harness, size: int) -> None:
    h.policies[("ml", "ckpt")] = UID_A
    pod = new_pod_uid()
    target = h.target(pod)
    h.publish(target, "ml", pod)
    (target / "step-1.bin").write_bytes(b"x" * size)
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

        def evaluated() -> bool:
            groups = prom.api("rules")["groups"]
            return bool(groups) and all(r["health"] == "ok" and r.get("lastEvaluation", "")
                                        [:4] not in ("", "0001") for g in groups
                                        for r in g["rules"])
        prom.wait_for("every rule evaluated", evaluated)

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
