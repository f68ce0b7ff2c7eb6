"""agent.ambientEndpoints reaches the operator as the list its config reads,
and a value that is not an http(s) URL is refused by the chart's schema."""

from __future__ import annotations

import io
from typing import Any

import yaml
from tests.chart.support import CHART, Tools


def _operator_env(tools: Tools, *args: str) -> dict[str, Any]:
    text = tools.run("helm", "template", "ckptdrain", str(CHART), *args).stdout
    deployment = next(d for d in yaml.safe_load_all(io.StringIO(text))
                      if d and d["kind"] == "Deployment")
    return {e["name"]: e.get("value")
            for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_the_ambient_endpoints_reach_the_operator(tools: Tools) -> None:
    from ckptdrain.operator import config

    def read(*args: str) -> Any:
        env = _operator_env(tools, *args)
        return config.from_env({"CKPTDRAIN_AMBIENT_ENDPOINTS":
                                env["CKPTDRAIN_AMBIENT_ENDPOINTS"]}).ambient_endpoints

    assert read() == ()
    assert read("--set", "agent.ambientEndpoints={https://minio.storage.svc:9000,"
                "https://*.rgw.corp.example}") == (
        ("https", "minio.storage.svc", 9000), ("https", "*.rgw.corp.example", 443))


def test_a_value_that_is_not_a_url_is_refused(tools: Tools) -> None:
    result = tools.run("helm", "template", "ckptdrain", str(CHART), "--set",
                       "agent.ambientEndpoints={minio:9000}", check=False)
    assert result.returncode != 0 and "ambientEndpoints" in result.stderr
