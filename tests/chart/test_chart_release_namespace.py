"""The CSI node tier against the release namespace's Pod Security, on a real
kube-apiserver: the driver's DaemonSet is privileged, so an install or an
upgrade into a namespace enforcing baseline or restricted must fail with a
message naming the way on, not succeed and leave injected pods waiting in
ContainerCreating. Under `helm template` nothing is looked up."""

from __future__ import annotations

import subprocess

import pytest
from tests.chart.support import CHART, REPO, Tools, adopt_crds
from tests.support.apiserver import Cluster

pytestmark = pytest.mark.cluster

ENFORCE = "pod-security.kubernetes.io/enforce"
RELEASED = REPO / "tests" / "fixtures" / "released" / "ckptdrain-0.1.0.tgz"


def namespace(cluster: Cluster, name: str, level: str) -> None:
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, f"{ENFORCE}={level}")


def helm(tools: Tools, cluster: Cluster, *args: str,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    return tools.run("helm", *args, env=cluster.env(), check=check)


def assert_refused_naming_the_way_on(result: subprocess.CompletedProcess[str], ns: str,
                                     level: str) -> None:
    out = f"{result.stdout}\n{result.stderr}"
    assert result.returncode != 0, out
    assert "nodeTier.mode csi" in out, out
    assert f"{ENFORCE}={level}" in out, out
    assert f"kubectl label ns {ns} {ENFORCE}=privileged" in out, out
    assert "nodeTier.mode: hostPath" in out, out


@pytest.mark.parametrize("level", ["restricted", "baseline"])
def test_an_install_into_a_namespace_refusing_privileged_fails(
        tools: Tools, cluster: Cluster, level: str) -> None:
    ns = release = f"psa-{level}"
    namespace(cluster, ns, level)
    adopt_crds(cluster, release, ns)
    try:
        result = helm(tools, cluster, "install", release, str(CHART), "-n", ns, check=False)
        assert_refused_naming_the_way_on(result, ns, level)
        assert helm(tools, cluster, "status", release, "-n", ns, check=False).returncode != 0
    finally:
        helm(tools, cluster, "uninstall", release, "-n", ns, check=False)


def test_an_install_into_a_privileged_namespace_runs_the_driver(
        tools: Tools, cluster: Cluster) -> None:
    ns = release = "psa-privileged"
    namespace(cluster, ns, "privileged")
    adopt_crds(cluster, release, ns)
    try:
        helm(tools, cluster, "install", release, str(CHART), "-n", ns)
        driver = cluster.kubectl("get", "daemonset", "-n", ns, "-o", "name",
                                 "-l", "app.kubernetes.io/component=csi-node").stdout
        assert driver.strip().startswith("daemonset.apps/"), driver
    finally:
        helm(tools, cluster, "uninstall", release, "-n", ns, check=False)


def test_a_plain_upgrade_of_a_hostpath_install_in_a_restricted_namespace_fails(
        tools: Tools, cluster: Cluster) -> None:
    """main's docs advised restricted for the release namespace in the hostPath
    mode; the new default must not flip such an installation silently."""
    ns = release = "psa-upgrade"
    namespace(cluster, ns, "restricted")
    adopt_crds(cluster, release, ns)
    try:
        # 0.1.0 as users installed it: hostPath by default, nothing named.
        helm(tools, cluster, "install", release, str(RELEASED), "-n", ns)
        result = helm(tools, cluster, "upgrade", release, str(CHART), "-n", ns, check=False)
        assert_refused_naming_the_way_on(result, ns, "restricted")
        assert "ckptdrain-0.1.0" in helm(tools, cluster, "list", "-n", ns).stdout
        # Naming the fallback keeps the installation as it was.
        kept = helm(tools, cluster, "upgrade", release, str(CHART), "-n", ns,
                    "--set", "nodeTier.mode=hostPath")
        assert "Node tier: hostPath" in kept.stdout
    finally:
        helm(tools, cluster, "uninstall", release, "-n", ns, check=False)


def test_a_render_without_a_cluster_is_not_checked(tools: Tools) -> None:
    """helm template (and GitOps renders) see no namespace: they render."""
    text = tools.run("helm", "template", "ckptdrain", str(CHART), "-n", "ckptdrain").stdout
    assert "kind: DaemonSet" in text
