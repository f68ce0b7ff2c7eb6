"""Fixtures for the chart tests: the cached helm/kubeconform builds and one
real kube-apiserver (with our CRDs applied) shared by the module."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
# tests/ is not a package; the shared server support lives in tests/support.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.chart import openapi_schemas  # noqa: E402
from tests.chart.support import CRDS, TOOLS, Tools  # noqa: E402
from tests.support import apiserver  # noqa: E402


@pytest.fixture(scope="session")
def tools() -> Tools:
    """helm and kubeconform from e2e/deps/helm-tools.sh; missing → a failure
    that says how to build them, never a skip."""
    found = Tools(helm=TOOLS / "helm", kubeconform=TOOLS / "kubeconform")
    missing = [str(p) for p in (found.helm, found.kubeconform) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail("helm/kubeconform are missing (" + ", ".join(missing) + "). Build them "
                    "once with `make servers` (it runs e2e/deps/helm-tools.sh).",
                    pytrace=False)
    return found


@pytest.fixture(scope="module")
def cluster() -> Iterator[apiserver.Cluster]:
    """A real etcd + kube-apiserver with our CRDs applied and established.
    Privileged containers allowed, as every real cluster's apiserver does
    (kubeadm, the managed ones): the chart's default CSI driver is one."""
    yield from apiserver.crd_cluster(CRDS, extra_args=["--allow-privileged=true"])


@pytest.fixture(scope="module")
def schema_dir(cluster: apiserver.Cluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kubeconform schemas for every kind the API server serves, ours included
    (written from its /openapi/v2 after the CRDs are applied)."""
    directory = tmp_path_factory.mktemp("schemas")
    # The OpenAPI document lags CRD creation by a moment: wait for every
    # group in crds/.
    groups = {d["spec"]["group"] for p in CRDS.glob("*.yaml")
              for d in yaml.safe_load_all(p.read_text()) if d}
    spec: dict = {}
    for _ in range(60):
        spec = json.loads(cluster.kubectl("get", "--raw", "/openapi/v2", timeout=120).stdout)
        gvks = {gvk["group"] for d in spec["definitions"].values()
                for gvk in d.get("x-kubernetes-group-version-kind", [])}
        if groups <= gvks:
            break
        time.sleep(1)
    written = openapi_schemas.write(spec, directory)
    assert "checkpointpolicy-ckptdrain-v1alpha1.json" in written, sorted(written)[:20]
    return directory
