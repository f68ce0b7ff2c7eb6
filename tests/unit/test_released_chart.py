"""tests/fixtures/released/ckptdrain-0.1.0.tgz and ckptdrain-0.2.0.tgz are
the charts 0.1.0 and 0.2.0 shipped, which tests/cluster/test_chart_upgrade.py
upgrades from: their versions, their CRDs (0.1.0 defining v1beta1 without
serving it; 0.2.0 serving both, storing v1alpha1), and their links resolved
(each package holds its CRDs)."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
RELEASED = REPO / "tests" / "fixtures" / "released"


def _packaged(path: str, release: str = "0.1.0") -> str:
    with tarfile.open(RELEASED / f"ckptdrain-{release}.tgz") as tar:
        member = tar.extractfile(f"ckptdrain/{path}")
        assert member is not None, path
        return member.read().decode()


def _policy_crd(text: str) -> dict[str, Any]:
    return dict(next(d for d in yaml.safe_load_all(text) if d))


def test_the_package_is_the_0_1_0_chart() -> None:
    chart = yaml.safe_load(_packaged("Chart.yaml"))
    assert (chart["name"], chart["version"], chart["appVersion"]) == (
        "ckptdrain", "0.1.0", "0.1.0")
    ours = yaml.safe_load((REPO / "charts" / "ckptdrain" / "Chart.yaml").read_text())
    assert ours["version"] != chart["version"], "this chart serves v1beta1: a new version"


def test_its_crd_defines_v1beta1_without_serving_it_and_names_the_webhook() -> None:
    crd = _policy_crd(_packaged("files/crds/checkpointpolicies.yaml"))
    versions = {v["name"]: (v["served"], v["storage"]) for v in crd["spec"]["versions"]}
    assert versions == {"v1alpha1": (True, True), "v1beta1": (False, False)}
    assert crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["path"] == "/convert"
    # The CRD template reads files/crds: every ckptdrain.io CRD is in the package.
    for name in ("checkpointclasses", "checkpointpolicies", "checkpoints", "checkpointshares"):
        assert _packaged(f"files/crds/{name}.yaml").startswith("#"), name
    assert "files/crds/*.yaml" in _packaged("templates/crds.yaml")


def test_the_0_2_0_package_serves_both_versions_and_stores_v1alpha1() -> None:
    chart = yaml.safe_load(_packaged("Chart.yaml", "0.2.0"))
    assert (chart["name"], chart["version"], chart["appVersion"]) == (
        "ckptdrain", "0.2.0", "0.2.0")
    ours = yaml.safe_load((REPO / "charts" / "ckptdrain" / "Chart.yaml").read_text())
    assert ours["version"] != chart["version"], "this chart stores v1beta1: a new version"
    crd = _policy_crd(_packaged("files/crds/checkpointpolicies.yaml", "0.2.0"))
    versions = {v["name"]: (v["served"], v["storage"]) for v in crd["spec"]["versions"]}
    assert versions == {"v1alpha1": (True, True), "v1beta1": (True, False)}
    assert crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["path"] == "/convert"
    for name in ("checkpointclasses", "checkpointpolicies", "checkpoints", "checkpointshares"):
        assert _packaged(f"files/crds/{name}.yaml", "0.2.0").startswith("#"), name

