"""Fixtures for tests against a real etcd + kube-apiserver (see
tests/support/apiserver.py): one cluster and one operator per session, one
namespace per test."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_helpers import CLASSES, POLICIES, csi_driver_rules
from kubernetes import client, config
from operator_process import PEAK_RSS_KIB, OperatorProcess, repo_root

from support import apiserver, audit_log
from support.conversion_server import ConversionServer, converting_crds

pytestmark = pytest.mark.cluster

#: The CRDs every session installs, as crds/ ships them.
SESSION_CRDS = ("checkpointpolicies", "checkpoints", "checkpointshares", "checkpointclasses")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The operator's peak resident memory over the session (chart requests)."""
    if PEAK_RSS_KIB:
        terminalreporter.write_line(
            f"operator peak RSS (with its admission process): "
            f"{max(PEAK_RSS_KIB) / 1024:.0f} MiB "
            f"(max of {len(PEAK_RSS_KIB)} process(es))")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[apiserver.Cluster]:
    """A real apiserver for the session. Missing binaries fail, naming `make servers`.
    Privileged containers allowed, as real clusters' apiservers do: the chart
    a test installs or upgrades to runs the privileged CSI driver by default.
    Its audit log is the one docs/audit.md recommends (support/audit_log.py),
    in which the hostile-tenant suite finds the apiserver's refusals of B."""
    apiserver.binaries_or_fail()
    workdir = tmp_path_factory.mktemp("apiserver")
    with apiserver.running(workdir, extra_args=["--allow-privileged=true",
                                                *audit_log.apiserver_args(workdir)]) as running:
        yield running


@pytest.fixture(scope="session")
def session_conversion(cluster: apiserver.Cluster) -> Iterator[ConversionServer]:
    """The session's CRDs as crds/ ships them, the CheckpointPolicy CRD's
    conversion sent to an admission process of its own (no Service here):
    v1beta1 is stored, so every test that writes or reads v1alpha1 needs it.
    A test that applies the CRD again keeps it converting
    (`session_conversion.converting(crd)`)."""
    root = repo_root() / "crds"
    with converting_crds(cluster, [root / f"{name}.yaml" for name in SESSION_CRDS]) as server:
        apiserver.wait_established(cluster, *(f"{name}.ckptdrain.io" for name in SESSION_CRDS))
        yield server


@pytest.fixture(scope="session")
def crds(session_conversion: ConversionServer) -> None:
    """The session's CRDs, installed and converting (session_conversion)."""


@pytest.fixture(scope="session")
def operator(cluster: apiserver.Cluster, crds: None,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(cluster, tmp_path_factory.mktemp("operator"))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def namespace(cluster: apiserver.Cluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    # No namespace controller runs here, so deleting the namespace would not
    # delete its objects; delete them first.
    cluster.kubectl("delete", "-n", name,
                    f"pods,checkpoints,checkpointshares,{POLICIES}", "--all",
                    "--wait=false", check=False)
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def apply(cluster: apiserver.Cluster, namespace: str) -> Callable[..., Any]:
    def _apply(obj: dict[str, Any], check: bool = True) -> Any:
        return cluster.kubectl("apply", "-n", namespace, "-f", "-",
                               input=json.dumps(obj), check=check)
    return _apply


@pytest.fixture
def classes(cluster: apiserver.Cluster, operator: OperatorProcess
            ) -> Iterator[Callable[..., None]]:
    """Apply CheckpointClasses (cluster-scoped: the namespace fixture does not
    clean them up); each is deleted, and waited for, after the test."""
    made: list[str] = []

    def make(body: dict[str, Any]) -> None:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
        made.append(body["metadata"]["name"])
    yield make
    for name in made:
        cluster.kubectl("delete", CLASSES, name, "--ignore-not-found", "--wait=true")


@pytest.fixture
def driver_api(cluster: apiserver.Cluster, crds: None,
               namespace: str) -> Iterator[client.CustomObjectsApi]:
    """The apiserver as the CSI driver's ServiceAccount sees it: bound to a
    ClusterRole of the rules docs/csi-driver.md shows, nothing more."""
    name = f"csi-driver-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "serviceaccount", name, "-n", namespace)
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": csi_driver_rules()}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": name},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": [role, binding]}))
    kubeconfig = cluster.kubeconfig_for(namespace, name)
    api = client.CustomObjectsApi(config.new_client_from_config(str(kubeconfig)))
    try:
        yield api
    finally:
        cluster.kubectl("delete", "clusterrolebinding,clusterrole", name, check=False)
