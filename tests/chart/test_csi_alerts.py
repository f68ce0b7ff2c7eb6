"""The CSI node driver's alerts as the chart renders them
(templates/prometheusrule-csi.yaml): only with the driver installed and
scraped; `promtool check rules`, every alert unit-tested with `promtool test
rules` from alerts/csi_cases.yaml; each links to its runbook section and
names only series the driver exports under labels its PodMonitor gives; the
thresholds follow the values and bad ones fail `helm template` naming them.
A real Prometheus scraping a real driver: tests/integration/
test_csi_alerts_prometheus.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.chart.support import CHART, REPO, Tools, documents, render
from tests.docs.blocks import parse
from tests.support import prometheus

from ckptdrain.csi.collection import DELETE, Reclaim
from ckptdrain.csi.collector import Collector
from ckptdrain.csi.metrics import registry_for
from ckptdrain.csi.volumes import Owner, PolicyFound, VolumeStore

CASES = Path(__file__).parent / "alerts" / "csi_cases.yaml"
RUNBOOKS = REPO / "docs" / "alerts.md"
RULES = "ckptdrain-csi-node"
ALL_ON = [*prometheus.CSI_ON, "--set", "metrics.prometheusRule.enabled=true"]


def _alerts(rules: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


def _expr(rules: dict[str, Any], alert: str) -> str:
    return next(str(r["expr"]) for r in _alerts(rules) if r["alert"] == alert)


def _rule_objects(tools: Tools, *args: str) -> list[dict[str, Any]]:
    return [d for d in documents(render(tools, *args).stdout) if d["kind"] == "PrometheusRule"]


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    try:
        prometheus.binary("promtool")
        return prometheus.chart_rules(*prometheus.CSI_ON, template=prometheus.CSI_RULES)
    except prometheus.MissingBinaries as err:
        pytest.fail(str(err), pytrace=False)


def test_rendered_only_with_the_driver_on_and_scraped(tools: Tools) -> None:
    def names(*args: str) -> set[str]:
        return {d["metadata"]["name"] for d in _rule_objects(tools, *args)}

    assert names(*ALL_ON) == {"ckptdrain", RULES}
    # The default mode is csi: scraped and alerted on without naming it.
    assert names("--set", "metrics.podMonitor.enabled=true",
                 "--set", "metrics.prometheusRule.enabled=true") == {"ckptdrain", RULES}
    # The driver off (the hostPath fallback): only the agents' rules.
    assert names("--set", "nodeTier.mode=hostPath", "--set", "metrics.podMonitor.enabled=true",
                 "--set", "metrics.prometheusRule.enabled=true") == {"ckptdrain"}
    # The driver on but not scraped: nothing to alert on.
    assert names("--set", "nodeTier.mode=csi",
                 "--set", "metrics.prometheusRule.enabled=true") == {"ckptdrain"}
    assert names(*ALL_ON, "--set", "csiDriver.metrics.port=0") == {"ckptdrain"}
    # No rules asked for: none.
    assert names(*prometheus.CSI_ON) == set()


def test_the_rules_are_labelled_as_the_driver_they_watch(tools: Tools) -> None:
    [csi] = [d for d in _rule_objects(tools, *ALL_ON) if d["metadata"]["name"] == RULES]
    assert csi["metadata"]["labels"]["app.kubernetes.io/component"] == "csi-node"


def test_the_driver_down_alert_selects_the_job_its_pod_monitor_sets(tools: Tools) -> None:
    docs = documents(render(tools, *ALL_ON).stdout)
    [monitor] = [d for d in docs if d["kind"] == "PodMonitor"
                 and d["metadata"]["name"] == RULES]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    relabel = endpoint["relabelings"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "node"} in relabel
    # The driver's `namespace` label is the policy's (its only label that a
    # target label also has): kept as it is, not renamed exported_namespace.
    assert endpoint["honorLabels"] is True
    [job] = [r["replacement"] for r in relabel if r["targetLabel"] == "job"]
    [daemonset] = [d for d in docs if d["kind"] == "DaemonSet"]
    assert job == daemonset["metadata"]["name"] == RULES
    [rule] = [r for d in docs if d["kind"] == "PrometheusRule" for g in d["spec"]["groups"]
              for r in g["rules"] if r.get("alert") == "CkptdrainNodeTierDriverDown"]
    assert f'up{{job="{job}"}}' in rule["expr"]


def test_promtool_accepts_the_rules(rules: dict[str, Any], tmp_path: Path) -> None:
    result = prometheus.check_rules(rules, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts(rules))} rules found" in result.stdout, result.stdout


def _run_cases(rules: dict[str, Any], tmp_path: Path) -> Any:
    return prometheus.run_rule_cases(rules, CASES, tmp_path)


def test_every_alert_fires_and_stays_quiet_as_its_cases_say(
        rules: dict[str, Any], tmp_path: Path) -> None:
    tested = {t["alertname"] for case in yaml.safe_load(CASES.read_text())["tests"]
              for t in case["alert_rule_test"]}
    assert tested == {a["alert"] for a in _alerts(rules)}
    result = _run_cases(rules, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_thresholds_follow_the_values(tmp_path: Path) -> None:
    """The cases can fail: a lower free-space threshold and more stalled
    intervals do not fire where the defaults' cases expect."""
    changed = prometheus.chart_rules(
        *prometheus.CSI_ON, "--set-json", "metrics.prometheusRule.csiDriver.diskFreeRatio=0.02",
        "--set", "metrics.prometheusRule.csiDriver.scanStalledIntervals=8",
        template=prometheus.CSI_RULES)
    result = _run_cases(changed, tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "CkptdrainNodeTierDiskNearlyFull" in out and "CkptdrainNodeTierScanStalled" in out
    assert "CkptdrainNodeTierUnknownOwners" not in out  # the others still hold


def test_each_alert_links_to_its_runbook_section(rules: dict[str, Any]) -> None:
    headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                for h in re.findall(r"^## (.+)$", RUNBOOKS.read_text(), re.M)}
    for alert in _alerts(rules):
        base, _, anchor = alert["annotations"]["runbook_url"].partition("#")
        assert base.endswith("docs/alerts.md")
        assert anchor == alert["alert"].lower() and anchor in headings, (anchor, headings)
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}


def _driver_metrics(root: Path) -> set[str]:
    """Every series name the driver exports after a real scan of `root`,
    where a deleted policy's data waits out its grace."""
    def resolve(namespace: str, name: str) -> PolicyFound | None:
        return None  # every policy deleted

    uid = "11111111-1111-4111-8111-111111111111"
    (root / "ml" / uid / "data").mkdir(parents=True)
    (root / "ml" / uid / "owner.json").write_text(Owner("ml", uid, "ckpt", 2000).to_json())
    collector = Collector(VolumeStore(root, resolve, mounter=None),  # type: ignore[arg-type]
                          resolve, Reclaim(DELETE, 60.0), 60.0, lambda path: False)
    collector.scan()
    return {s.name for family in registry_for(collector).collect() for s in family.samples}


def test_rules_name_only_series_the_driver_exports(rules: dict[str, Any],
                                                    tmp_path: Path) -> None:
    known = _driver_metrics(tmp_path)
    assert {"ckptdrain_csi_scan_interval_seconds", "ckptdrain_csi_started_timestamp_seconds",
            "ckptdrain_csi_oldest_pending_deletion_timestamp_seconds",
            "ckptdrain_csi_earliest_pending_deletion_due_timestamp_seconds"} <= known
    for alert in _alerts(rules):
        named = set(re.findall(r"\bckptdrain_[a-z0-9_]+", alert["expr"]))
        assert named <= known, (alert["alert"], named - known)
        assert named or 'up{job="' in alert["expr"], alert["alert"]
        # Grouped by the node the PodMonitor labels, never by a tenant's labels.
        assert re.search(r"by \(node[,)]", alert["expr"]), alert["alert"]


BAD = {
    "a ratio over 1": ("metrics.prometheusRule.csiDriver.diskFreeRatio", "1.5",
                       "at '/metrics/prometheusRule/csiDriver/diskFreeRatio'"),
    "a ratio of 0": ("metrics.prometheusRule.csiDriver.diskFreeRatio", "0",
                     "at '/metrics/prometheusRule/csiDriver/diskFreeRatio'"),
    "one stalled interval": ("metrics.prometheusRule.csiDriver.scanStalledIntervals", "1",
                             "at '/metrics/prometheusRule/csiDriver/scanStalledIntervals'"),
    "a duration without a unit": ("metrics.prometheusRule.csiDriver.deletionOverdueAfter",
                                  '"6"', "at '/metrics/prometheusRule/csiDriver/"
                                         "deletionOverdueAfter'"),
    "a retained share over 1": ("metrics.prometheusRule.csiDriver.retainedDiskRatio", "1.5",
                                "at '/metrics/prometheusRule/csiDriver/retainedDiskRatio'"),
    "a misspelt key": ("metrics.prometheusRule.csiDriver.diskFreeRation", "0.2",
                       "diskFreeRation"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_thresholds_fail_naming_them(tools: Tools, case: str) -> None:
    key, value, needle = BAD[case]
    result = render(tools, *ALL_ON, "--set-json", f"{key}={value}", check=False)
    assert result.returncode != 0, f"{case} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert needle in result.stderr, result.stderr


OVERDUE = "CkptdrainNodeTierDeletionOverdue"


@pytest.mark.parametrize(("grace", "scan", "expected_s"), [
    ("1h", "60s", 3600 + 2 * 60),
    ("2h30m", "5m", 9000 + 2 * 300),
    ("1.5h", "30s", 5400 + 2 * 30),
])
def test_deletions_are_overdue_a_grace_and_two_scans_past_their_due_time_by_default(
        grace: str, scan: str, expected_s: int) -> None:
    rules = prometheus.chart_rules(*prometheus.CSI_ON, "--set", f"csiDriver.reclaim.gracePeriod="
                                   f"{grace}", "--set", f"csiDriver.scanInterval={scan}",
                                   template=prometheus.CSI_RULES)
    # Counted from the due time (first sighting plus the directory's own
    # grace): twice the driver's grace and two scans from the sighting.
    assert "time() - ckptdrain_csi_earliest_pending_deletion_due_timestamp_seconds" in \
        _expr(rules, OVERDUE)
    assert _expr(rules, OVERDUE).endswith(f") > {expected_s}"), _expr(rules, OVERDUE)


@pytest.mark.parametrize(("grace", "scan", "overdue"), [
    ("1h", "60s", "1h"), ("1h", "60s", "1h2m"), ("3h", "60s", "2h"), ("1h", "30m", "1h59m")])
def test_an_overdue_threshold_within_the_grace_and_two_scans_fails_naming_both(
        tools: Tools, grace: str, scan: str, overdue: str) -> None:
    result = render(tools, *ALL_ON, "--set", f"csiDriver.reclaim.gracePeriod={grace}",
                    "--set", f"csiDriver.scanInterval={scan}", "--set",
                    f"metrics.prometheusRule.csiDriver.deletionOverdueAfter={overdue}",
                    check=False)
    assert result.returncode != 0, f"{overdue} past a {grace} grace was accepted"
    assert (f"metrics.prometheusRule.csiDriver.deletionOverdueAfter ({overdue}): expected more "
            f"than csiDriver.reclaim.gracePeriod ({grace}) plus two csiDriver.scanInterval "
            f"({scan})") in result.stderr, result.stderr


def test_an_overdue_threshold_past_the_grace_and_two_scans_is_used() -> None:
    rules = prometheus.chart_rules(
        *prometheus.CSI_ON, "--set", "metrics.prometheusRule.csiDriver.deletionOverdueAfter=1h3m",
        template=prometheus.CSI_RULES)
    assert _expr(rules, OVERDUE).endswith(") > 180")
    [overdue] = [a for a in _alerts(rules) if a["alert"] == OVERDUE]
    assert ("after its grace period ran out (alert 3m0s past it; deletionOverdueAfter 1h3m "
            "less the driver's grace period 1h)") in overdue["annotations"]["summary"]


def test_the_docs_example_sets_what_it_says(tmp_path: Path) -> None:
    """docs/alerts.md's example ("to alert from 15% free and on deletions 4
    hours overdue") renders rules with those thresholds."""
    [block] = [b for b in parse(RUNBOOKS) if b.note == "values" and "csiDriver:" in b.text]
    values = tmp_path / "values.yaml"
    values.write_text(block.text)
    rules = prometheus.chart_rules("-f", str(values), template=prometheus.CSI_RULES)
    assert _expr(rules, "CkptdrainNodeTierDiskNearlyFull").endswith(") < 0.15")
    # 4 h from the sighting on the driver's 1 h grace: 3 h past the due time.
    assert _expr(rules, OVERDUE).endswith(f") > {4 * 3600 - 3600}")


def test_the_defaults_are_documented() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    defaults = values["metrics"]["prometheusRule"]["csiDriver"]
    page = RUNBOOKS.read_text()
    for key, value in defaults.items():
        shown = value if value != "" else "empty"
        assert f"`{key}` ({shown}" in page, key
