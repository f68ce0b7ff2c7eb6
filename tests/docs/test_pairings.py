"""Each page's install line, policies and jobs fit together, as a user who
runs the page's commands on a fresh cluster would find: the operator
configured by that page's chart values admits its policies, the chart
creates the agent's ServiceAccount where its jobs run, a policy selects each
job with as many writers as it has pods, and a job that runs the project's
image runs the one the chart installs."""

from __future__ import annotations

from typing import Any

import pytest
from tests.docs import pages
from tests.docs.blocks import REPO
from tests.docs.conftest import config_from_env, policy_problems, render, selects, stored

pytestmark = pytest.mark.cluster  # helm, built by `make servers`

PAGES = [p for p in pages.pages() if p.helm_args is not None or p.values_files]


class Chart:
    """What the chart renders for one page's values."""

    def __init__(self, page: pages.Page) -> None:
        args = page.helm_args if page.helm_args is not None else [
            a for f in page.values_files for a in ("-f", str(f))]
        objects = render(args)
        deployment = next(o for o in objects if o["kind"] == "Deployment")
        env = {e["name"]: e["value"] for e in
               deployment["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
        # The certificate files exist only inside the pod.
        self.config = config_from_env(
            {k: v for k, v in env.items() if not k.startswith("CKPTDRAIN_WEBHOOK_")})
        self.image = env["CKPTDRAIN_IMAGE"]
        self.agent_namespaces = {
            o["metadata"]["namespace"] for o in objects
            if o["kind"] == "ServiceAccount"
            and o["metadata"]["name"] == self.config.agent_service_account}


def _id(page: pages.Page) -> str:
    return str(page.path.relative_to(REPO))


@pytest.fixture(scope="module", params=PAGES, ids=_id)
def page(request: pytest.FixtureRequest) -> tuple[pages.Page, Chart]:
    return request.param, Chart(request.param)


def test_pages_with_an_install_were_found() -> None:
    names = {_id(p) for p in PAGES}
    assert {"README.md", "docs/quickstart.md", "docs/install.md", "docs/cloud/eks.md",
            "docs/cloud/gke.md", "docs/cloud/onprem.md"} <= names, names


def test_the_operator_admits_the_pages_policies(page: tuple[pages.Page, Chart]) -> None:
    doc, chart = page
    policies = doc.policies()
    assert policies, f"{_id(doc)} installs the chart but names no policy"
    for p in policies:
        problems = policy_problems(stored(p)["spec"], chart.config, p["metadata"]["name"])
        assert problems == [], f"{_id(doc)}: {p['metadata']['name']}: {problems}"


def test_policies_live_where_the_agent_has_its_service_account(
        page: tuple[pages.Page, Chart]) -> None:
    doc, chart = page
    for p in doc.policies():
        ns = p["metadata"].get("namespace")
        assert ns in chart.agent_namespaces, (
            f"{_id(doc)}: policy {p['metadata']['name']} in {ns!r}, "
            f"agent.namespaces {sorted(chart.agent_namespaces)}")


def test_the_page_creates_the_namespaces_the_chart_needs(
        page: tuple[pages.Page, Chart]) -> None:
    """helm install fails on an agent namespace that does not exist yet."""
    doc, chart = page
    if doc.helm_args is None:
        return
    assert chart.agent_namespaces, f"{_id(doc)}: helm install leaves agent.namespaces empty"
    missing = chart.agent_namespaces - doc.created
    assert not missing, f"{_id(doc)}: no `kubectl create namespace` for {sorted(missing)}"


def _writers_selecting(doc: pages.Page, job: dict[str, Any]) -> list[dict[str, Any]]:
    labels = job["spec"]["template"]["metadata"]["labels"]
    return [p for p in doc.policies()
            if p["metadata"].get("namespace") == job["metadata"]["namespace"]
            and selects(p["spec"]["selector"], labels)]


def test_each_job_is_selected_and_can_run(page: tuple[pages.Page, Chart]) -> None:
    doc, chart = page
    for job in doc.workloads():
        name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
        pod = job["spec"]["template"]["spec"]
        assert ns in chart.agent_namespaces, (
            f"{_id(doc)}: job {name} in {ns!r}, agent.namespaces {sorted(chart.agent_namespaces)}")
        assert pod.get("serviceAccountName") == chart.config.agent_service_account, (
            f"{_id(doc)}: job {name} runs as {pod.get('serviceAccountName')!r}, the chart "
            f"creates {chart.config.agent_service_account!r}")
        policies = _writers_selecting(doc, job)
        assert len(policies) == 1, (
            f"{_id(doc)}: job {name} is selected by {len(policies)} policies of the page")
        writers = policies[0]["spec"].get("writers", 1)
        assert job["spec"].get("completions", 1) == writers, (
            f"{_id(doc)}: job {name} has {job['spec'].get('completions', 1)} pods, policy "
            f"{policies[0]['metadata']['name']} writers: {writers}")
        for c in pod["containers"]:
            if c.get("command", [])[:3] == ["python3", "-m", "ckptdrain.demo.trainer"]:
                assert c["image"] == chart.image, (
                    f"{_id(doc)}: job {name} runs {c['image']}, the chart installs {chart.image}")


def test_every_example_file_is_documented() -> None:
    """An example no page uses is one nobody checks against its values."""
    used = set()
    for p in pages.pages():
        used |= {a.file for a in p.applied} | set(p.header) | set(p.values_files)
    examples = set((REPO / "docs" / "examples").rglob("*.yaml"))
    assert not examples - used, sorted(str(e.relative_to(REPO)) for e in examples - used)
