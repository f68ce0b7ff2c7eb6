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


def test_a_value_the_operator_would_refuse_is_refused_by_the_chart(tools: Tools) -> None:
    """Rendered, it would make the operator exit at start (a crash loop)."""
    for value in ("minio:9000", "https://*.com", "https://user@minio"):
        result = tools.run("helm", "template", "ckptdrain", str(CHART), "--set",
                           f"agent.ambientEndpoints={{{value}}}", check=False)
        assert result.returncode != 0 and "ambientEndpoints" in result.stderr, value
