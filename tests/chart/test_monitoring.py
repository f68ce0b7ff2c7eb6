"""What the chart ships for monitoring, as rendered: the agents' PodMonitor,
the PrometheusRule (checked with `promtool check rules`, every alert
unit-tested with `promtool test rules` from alerts/cases.yaml), the runbook
section each alert links to, and the Grafana dashboard (checked against
Grafana's published schema types, tests/chart/grafana_schema.py; every
metric it or a rule names is one the agent or operator exports; its queries
parse). Grafana's server is not used here (docs/alerts.md, "How these are
checked")."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY
from tests.chart import grafana_schema
from tests.chart.support import CHART, REPO, Tools
from tests.support import prometheus

from ckptdrain.agent.goodput import GoodputMetrics
from ckptdrain.agent.metrics import AgentMetrics
from ckptdrain.operator import metrics as operator_metrics
from ckptdrain.operator.admission import injection, pod_env
from ckptdrain.operator.recency import metrics as recency_metrics

pytestmark = pytest.mark.cluster

CASES = Path(__file__).parent / "alerts" / "cases.yaml"
DASHBOARD = CHART / "dashboards" / "ckptdrain.json"
RUNBOOKS = REPO / "docs" / "alerts.md"
MONITORING = ["--set", "metrics.podMonitor.enabled=true",
              "--set", "metrics.prometheusRule.enabled=true"]


def _objects(tools: Tools, *args: str) -> list[dict[str, Any]]:
    out = tools.run("helm", "template", "ckptdrain", str(CHART), "--namespace", "ckptdrain",
                    *args).stdout
    return [d for d in yaml.safe_load_all(io.StringIO(out)) if d]


def _kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _agents_monitors(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The PodMonitors of the injected agents, not the CSI driver's own
    (rendered beside them in the default csi mode: test_chart_csi.py)."""
    return [o for o in _kind(objects, "PodMonitor")
            if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") != "csi-node"]


def _alerts(rules: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in rules["groups"] for r in g["rules"] if "alert" in r]


def exported_metrics() -> set[str]:
    """Every series name the agent and the operator can export."""
    assert operator_metrics.POLICY_CONDITION  # registered on import
    assert recency_metrics.CHECKPOINT_TIME
    names: set[str] = set()
    agent = AgentMetrics()
    GoodputMetrics(agent.registry)  # on the agent's registry, as agent/command.py puts it
    for family in [*agent.registry.collect(), *REGISTRY.collect()]:
        suffixes = {"counter": ["_total", "_created"], "histogram": ["_bucket", "_sum", "_count",
                                                                    "_created"]}
        names.update(family.name + s for s in suffixes.get(family.type, [""]))
    return {n for n in names if n.startswith("ckptdrain_")}


def _named(expr: str) -> set[str]:
    return set(re.findall(r"\bckptdrain_[a-z0-9_]+", expr))


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    try:
        return prometheus.chart_rules()
    except prometheus.MissingBinaries as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="module")
def promtool_ready() -> None:
    try:
        prometheus.binary("promtool")
    except prometheus.MissingBinaries as err:
        pytest.fail(str(err), pytrace=False)


def test_nothing_that_needs_the_prometheus_operator_by_default(tools: Tools) -> None:
    objects = _objects(tools)
    for kind in ("PodMonitor", "PrometheusRule", "ServiceMonitor"):
        assert not _kind(objects, kind), kind
    # The dashboard is a plain ConfigMap: shipped unless turned off.
    (dashboard,) = [o for o in _kind(objects, "ConfigMap") if "ckptdrain.json" in o.get("data", {})]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["ckptdrain.json"]) == json.loads(DASHBOARD.read_text())
    off = _objects(tools, "--set", "metrics.dashboard.enabled=false")
    assert not [o for o in _kind(off, "ConfigMap") if "ckptdrain.json" in o.get("data", {})]


def test_the_dashboard_label_and_namespace_follow_the_values(tools: Tools) -> None:
    objects = _objects(tools, "--set", "metrics.dashboard.label=grafana.com/dashboard",
                       "--set", "metrics.dashboard.labelValue=ckptdrain",
                       "--set", "metrics.dashboard.namespace=monitoring",
                       "--set", "metrics.dashboard.annotations.grafana_folder=ML")
    (dashboard,) = [o for o in _kind(objects, "ConfigMap") if "ckptdrain.json" in o.get("data", {})]
    meta = dashboard["metadata"]
    assert meta["labels"]["grafana.com/dashboard"] == "ckptdrain"
    assert meta["namespace"] == "monitoring"
    assert meta["annotations"] == {"grafana_folder": "ML"}


def test_the_pod_monitor_scrapes_the_port_the_agent_is_injected_with(tools: Tools) -> None:
    (monitor,) = _agents_monitors(_objects(tools, *MONITORING))
    spec = monitor["spec"]
    # The injected sidecar's port, by name (operator/admission/injection.py).
    agent = injection._container("a", "agent", [], _config(), [], sidecar=True, resources={})
    assert agent["ports"] == [{"name": spec["podMetricsEndpoints"][0]["port"],
                               "containerPort": pod_env.AGENT_METRICS_PORT}]
    assert pod_env.AGENT_METRICS_PORT == 9108
    assert spec["selector"] == {"matchLabels": {"ckptdrain.io/inject": "true"}}
    assert spec["namespaceSelector"] == {"any": True}
    relabel = spec["podMetricsEndpoints"][0]["relabelings"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_annotation_ckptdrain_io_policy"],
            "targetLabel": "policy"} in relabel
    # Training namespaces narrow it: agent.namespaces, or its own list.
    (narrow,) = _agents_monitors(_objects(tools, *MONITORING,
                                          "--set", "agent.namespaces={ml-a,ml-b}"))
    assert narrow["spec"]["namespaceSelector"] == {"matchNames": ["ml-a", "ml-b"]}
    (own,) = _agents_monitors(_objects(tools, *MONITORING, "--set", "agent.namespaces={ml-a}",
                                       "--set", "metrics.podMonitor.namespaces={ml-c}"))
    assert own["spec"]["namespaceSelector"] == {"matchNames": ["ml-c"]}


def _config() -> Any:
    from ckptdrain.operator.config import OperatorConfig

    return OperatorConfig()


def test_the_operator_monitor_keeps_the_policy_labels(tools: Tools) -> None:
    """The operator's series name the policy's namespace: honorLabels keeps
    it from being renamed exported_namespace, which every alert groups by."""
    (monitor,) = _kind(_objects(tools, "--set", "metrics.serviceMonitor.enabled=true"),
                       "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True


def test_promtool_accepts_the_rules(rules: dict[str, Any], promtool_ready: None,
                                    tmp_path: Path) -> None:
    result = prometheus.check_rules(rules, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts(rules))} rules found" in result.stdout, result.stdout


def _run_cases(rules: dict[str, Any], tmp_path: Path) -> Any:
    return prometheus.run_rule_cases(rules, CASES, tmp_path)


def test_every_alert_fires_and_stays_quiet_as_its_cases_say(
        rules: dict[str, Any], promtool_ready: None, tmp_path: Path) -> None:
    tested = {t["alertname"] for case in yaml.safe_load(CASES.read_text())["tests"]
              for t in case["alert_rule_test"]}
    assert tested == {a["alert"] for a in _alerts(rules)}
    result = _run_cases(rules, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_cases_catch_a_changed_threshold(promtool_ready: None, tmp_path: Path) -> None:
    """The unit tests can fail: rules rendered for 5 intervals instead of 3
    do not fire where the cases expect."""
    changed = prometheus.chart_rules("--set", "metrics.prometheusRule.recoveryPointIntervals=5")
    result = _run_cases(changed, tmp_path)
    assert result.returncode != 0
    assert "CkptdrainRecoveryPointStale" in result.stdout + result.stderr


def test_each_alert_links_to_its_runbook_section(rules: dict[str, Any]) -> None:
    headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                for h in re.findall(r"^## (.+)$", RUNBOOKS.read_text(), re.M)}
    for alert in _alerts(rules):
        url = alert["annotations"]["runbook_url"]
        base, _, anchor = url.partition("#")
        assert base.endswith("docs/alerts.md"), url
        assert anchor == alert["alert"].lower() and anchor in headings, (url, sorted(headings))
        assert alert["labels"]["severity"] in {"critical", "warning", "info"}


def test_rules_name_only_exported_metrics(rules: dict[str, Any]) -> None:
    known = exported_metrics()
    for alert in _alerts(rules):
        named = _named(alert["expr"])
        assert named and named <= known, (alert["alert"], named - known)


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def test_the_dashboard_is_loadable_and_names_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    # What Grafana's provisioning keys on: a stable uid, a title, a schema version.
    assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", dashboard["uid"])
    assert dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    assert "id" not in dashboard  # an id would clash across Grafana instances
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "policy"):
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    known = exported_metrics()
    named: set[str] = set()
    for panel in _panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            found = _named(target["expr"])
            assert found <= known, (panel["title"], found - known)
            named |= found
    # The panels cover what the alerts watch.
    for metric in ("ckptdrain_last_checkpoint_timestamp_seconds", "ckptdrain_drain_lag_bytes",
                   "ckptdrain_drained_bytes_total", "ckptdrain_drain_errors_total",
                   "ckptdrain_policy_condition", "ckptdrain_unprotected_pods",
                   "ckptdrain_restores_total", "ckptdrain_restore_failing_pods",
                   "ckptdrain_restore_fallbacks", "ckptdrain_save_blocking_seconds_sum",
                   "ckptdrain_save_blocking_seconds_count", "ckptdrain_drain_overlap_ratio",
                   "ckptdrain_drain_overlap_target_ratio",
                   "ckptdrain_workload_checkpoint_time_seconds",
                   "ckptdrain_workload_checkpoint_step"):
        assert metric in named, metric


def test_the_metric_check_catches_a_misspelt_name() -> None:
    known = exported_metrics()
    assert "ckptdrain_drain_lag_bytes" in known
    assert not _named("ckptdrain_drain_lag_byte > 0") <= known


def test_the_dashboard_fits_grafanas_schema() -> None:
    """Decoded with Grafana's schema models (each panel's options and
    fieldConfig with its plugin's, each query with Prometheus'), nothing we
    wrote is dropped or changed, every value has the schema's type, and the
    panel types, data source references and grid positions hold."""
    assert grafana_schema.problems(json.loads(DASHBOARD.read_text())) == []


def _set(path: str, value: Any) -> Any:
    def change(dashboard: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = dashboard
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value
    return change


def _respell(path: str, old: str, new: str) -> Any:
    def change(dashboard: dict[str, Any]) -> None:
        node: Any = dashboard
        for key in path.split("."):
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[new] = node.pop(old)
    return change


@pytest.mark.parametrize(("change", "caught"), [
    (_respell("panels.2.targets.0", "legendFormat", "legendformat"),
     "$.panels[2].targets[0].legendformat: not in the schema"),
    (_respell("panels.1", "gridPos", "gridpos"), "$.panels[1].gridpos: not in the schema"),
    (_set("panels.1.options.colourMode", "background"),
     "$.panels[1].options.colourMode: not in the schema"),
    (_set("panels.3.fieldConfig.defaults.custom", {"lineWidht": 2}),
     "$.panels[3].fieldConfig.defaults.custom.lineWidht: not in the schema"),
    (_set("graphTooltip", 3), "$.graph_tooltip: 3 is not one of [0, 1, 2]"),
    (_set("templating.list.1.refresh", "2"), "$.templating.list_val[1].refresh: '2' is not"),
    (_set("panels.1.options.colorMode", "rainbow"),
     "$.panels[1].options.color_mode: 'rainbow' is not one of"),
    (_set("panels.1.gridPos.w", "8"), "$.panels[1].grid_pos.w: '8' is not of type int"),
    (_set("panels.1.type", "timeseries2"), "no schema for panel type 'timeseries2'"),
    (_set("panels.1.datasource.uid", "prometheus"),
     "$.panels[1].datasource: uid 'prometheus' is not a data source variable"),
    (_set("panels.2.gridPos.x", 4), "overlaps $.panels[1]"),
], ids=["misspelt query key", "misspelt panel key", "misspelt stat option",
        "misspelt timeseries field option", "cursor sync out of range",
        "variable refresh as a string", "unknown stat colour mode", "width as a string",
        "unknown panel type", "fixed data source uid", "overlapping panels"])
def test_the_schema_check_catches_a_misspelt_key_or_an_invalid_value(
        change: Any, caught: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    change(dashboard)
    found = grafana_schema.problems(dashboard)
    assert any(caught in p for p in found), found


def test_every_dashboard_query_parses(promtool_ready: None, tmp_path: Path) -> None:
    """Each panel's PromQL, with Grafana's variables filled in as Grafana
    would, passes promtool's parser (as recording rules: no server needed)."""
    dashboard = json.loads(DASHBOARD.read_text())
    fill = {"$__rate_interval": "2m", "$namespace": ".*", "$policy": ".*"}
    rules = []
    for i, target in enumerate(t for p in _panels(dashboard) for t in p["targets"]):
        expr = target["expr"]
        for variable, value in fill.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, target["expr"]
        rules.append({"record": f"ckptdrain:dashboard_query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = prometheus.promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout, result.stdout


def test_the_webhook_histogram_reaches_the_longest_timeout_the_chart_allows() -> None:
    # A review that ran near its timeout must land in a bucket of its own,
    # not in +Inf beside the ones the apiserver gave up on.
    schema = json.loads((CHART / "values.schema.json").read_text())
    longest = schema["properties"]["webhook"]["properties"]["timeoutSeconds"]["maximum"]
    buckets = operator_metrics.WEBHOOK_BUCKETS
    assert buckets[-1] >= longest
    assert list(buckets) == sorted(buckets)
    # A default install's timeout is a bucket edge: "reviews over the
    # timeout" is a count read off the histogram, not an estimate.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["webhook"]["timeoutSeconds"] in buckets
