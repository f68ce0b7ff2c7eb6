"""A real Prometheus (and promtool) for tests, and the chart's rendered alert rules.

    rules = chart_rules()                       # helm template, PrometheusRule spec
    with running(tmp_path, targets=[Target("127.0.0.1:9108", {...})]) as prom:
        prom.wait_for_scrape()
        prom.query('ckptdrain_drain_lag_bytes > 0')

Binaries come from e2e/deps/prometheus.sh (`make servers`); missing ones
raise MissingBinaries naming what to run, which tests turn into a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from tests.support.s3servers import free_port

CACHE = Path(os.environ.get("CKPTDRAIN_CACHE", Path.home() / ".cache" / "ckptdrain"))
BIN = CACHE / "prometheus" / "bin"
HELM = CACHE / "tools" / "bin" / "helm"
CHART = Path(__file__).resolve().parents[2] / "charts" / "ckptdrain"
WAIT_CAP = 120.0


class MissingBinaries(RuntimeError):
    """prometheus/promtool/helm are not built; `make servers` builds them."""


def binary(name: str) -> Path:
    path = HELM if name == "helm" else BIN / name
    if not os.access(path, os.X_OK):
        script = "e2e/deps/helm-tools.sh" if name == "helm" else "e2e/deps/prometheus.sh"
        raise MissingBinaries(f"{path} is missing. Build it once with `make servers` ({script}).")
    return path


#: The CSI node driver's alerts: rendered only with the driver on and scraped.
CSI_RULES = "templates/prometheusrule-csi.yaml"
CSI_ON = ("--set", "nodeTier.mode=csi", "--set", "metrics.podMonitor.enabled=true")


def chart_rules(*helm_args: str, template: str = "templates/prometheusrule.yaml"
                ) -> dict[str, Any]:
    """The `spec` (rule groups) of one of the chart's PrometheusRules (the
    agents' by default), rendered with `helm_args`."""
    out = subprocess.run(
        [str(binary("helm")), "template", "ckptdrain", str(CHART), "--namespace", "ckptdrain",
         "--set", "metrics.prometheusRule.enabled=true", "--show-only", template, *helm_args],
        capture_output=True, text=True, timeout=120, check=True).stdout
    doc = yaml.safe_load(out)
    return dict(doc["spec"])


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary("promtool")), *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def check_rules(rules: Mapping[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`promtool check rules` over a rendered rule file."""
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(dict(rules)))
    return promtool("check", "rules", str(path))


def run_rule_cases(rules: Mapping[str, Any], cases: Path,
                   tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`promtool test rules`: the unit cases in `cases` against `rules`."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(dict(rules)))
    doc = yaml.safe_load(cases.read_text())
    doc["rule_files"] = ["rules.yaml"]
    (tmp_path / "cases.yaml").write_text(yaml.safe_dump(doc))
    return promtool("test", "rules", "cases.yaml", cwd=tmp_path)


@dataclass(frozen=True)
class Target:
    address: str
    labels: Mapping[str, str]


class Prometheus:
    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url, self.proc, self.log = url, proc, log

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as r:
            doc = json.loads(r.read())
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now (a list of {metric, value})."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def wait_for(self, what: str, check: Any, cap: float = WAIT_CAP) -> Any:
        deadline = time.monotonic() + cap
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited ({self.proc.returncode}) waiting for "
                                     f"{what}\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}\n{self.log.read_text()[-3000:]}")

    def wait_for_every_rule_evaluated(self) -> None:
        """Every rule evaluated at least once, without an error."""
        def evaluated() -> bool:
            groups = self.api("rules")["groups"]
            return bool(groups) and all(r["health"] == "ok" and r.get("lastEvaluation", "")
                                        [:4] not in ("", "0001") for g in groups
                                        for r in g["rules"])
        self.wait_for("every rule evaluated", evaluated)

    def wait_for_scrape(self) -> None:
        """Every target scraped successfully at least once."""
        def all_up() -> bool:
            active = self.api("targets")["activeTargets"]
            return bool(active) and all(t["health"] == "up" for t in active)
        self.wait_for("every target to be scraped", all_up)


@contextlib.contextmanager
def running(root: Path, targets: Sequence[Target], *, rule_groups: Mapping[str, Any] | None = None,
            scrape_interval: str = "1s") -> Iterator[Prometheus]:
    """A prometheus on 127.0.0.1 scraping `targets`, with `rule_groups` loaded; stopped after."""
    root.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [{
            "job_name": "ckptdrain-agents",
            "static_configs": [{"targets": [t.address], "labels": dict(t.labels)}
                               for t in targets],
        }],
    }
    if rule_groups is not None:
        (root / "rules.yaml").write_text(yaml.safe_dump(dict(rule_groups)))
        config["rule_files"] = [str(root / "rules.yaml")]
    (root / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = root / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(binary("prometheus")), f"--config.file={root / 'prometheus.yml'}",
             f"--storage.tsdb.path={root / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=out, stderr=subprocess.STDOUT)
    prom = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:
        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False
        prom.wait_for("prometheus to be ready", ready)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
