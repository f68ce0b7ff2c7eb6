"""The upgrade from the released 0.2.0 chart (v1alpha1 stored, v1beta1
served and converted) to this one (v1beta1 stored) on the real apiserver:
policies written at v1alpha1 under 0.2.0 and held so in etcd, `helm
upgrade`, the operator's leader rewrites each one and sets the CRD's
status.storedVersions to [v1beta1], etcd holds every object at v1beta1,
both versions read back, the operator still reconciles and injects; then
the rollback to 0.2.0 reads what this release stored.

What runs where is as in test_chart_upgrade.py (whose fixture and helpers
this uses): the session's operator (reading v1beta1, migrating within
seconds: CKPTDRAIN_STORAGE_CHECK_PERIOD and CKPTDRAIN_STORAGE_SETTLE in
operator_process.py), stopped across the upgrade, stands for the chart's
replicas, and the CRD's conversion is sent to the session's
conversion server by URL where the chart names its Service."""

from __future__ import annotations

import copy
import json
from typing import Any

from cluster_helpers import INJECT, pod, policy, wait_for
from operator_process import OperatorProcess, repo_root
from test_chart_upgrade import (
    ALPHA,
    BETA,
    UNITS,
    as_shipped,
    crd,
    helm,
    patch_client_config,
    read,
    release,  # noqa: F401 -- the fixture, used by name
    resource,
    same_moment,
    served,
)
from tests.chart.support import adopt_crds

from ckptdrain.contract.policy_versions import convert
from support import etcd_keys
from support.apiserver import Cluster
from support.conversion_server import ConversionServer

RELEASED = repo_root() / "tests" / "fixtures" / "released" / "ckptdrain-0.2.0.tgz"
NAMES = ("units", "llama")


def etcd_version(cluster: Cluster, namespace: str, name: str) -> str | None:
    """The apiVersion etcd holds the policy at (no API read can say)."""
    held = etcd_keys.stored(cluster, etcd_keys.custom_object_key(
        "ckptdrain.io", "checkpointpolicies", namespace, name))
    return None if held is None else str(held["apiVersion"])


def converting_through(cluster: Cluster, conversion: ConversionServer) -> dict[str, Any]:
    """What a release's Service and its operator's CA do in a cluster: the
    CRD's conversion reaches a server that answers it. Returns the client
    config the release rendered, for `as_rendered` before each `helm
    upgrade` (Helm's patch sets the Service again, and a URL beside it is
    invalid)."""
    rendered = crd(cluster)["spec"]["conversion"]["webhook"]["clientConfig"]
    session = conversion.converting(crd(cluster))["spec"]["conversion"]["webhook"]
    patch_client_config(cluster, {"service": None, **session["clientConfig"]})
    # The apiserver takes up a CRD's new conversion a moment after the patch
    # returns, converting through the old one (the release's Service: no
    # endpoints here) until then. Objects stored at one version read at the
    # other convert; both versions listing proves every read goes through
    # the server now.
    wait_for(lambda: all(cluster.kubectl("get", resource(version), "-A", "-o", "name",
                                         check=False).returncode == 0
                         for version in (ALPHA, BETA)),
             what="the apiserver to convert through the session's server")
    return dict(rendered)


def as_rendered(cluster: Cluster, rendered: dict[str, Any]) -> None:
    patch_client_config(cluster, {"url": None, "caBundle": None, **rendered})


def test_objects_stored_under_0_2_0_are_migrated_to_v1beta1_by_the_upgrade(
        cluster: Cluster, operator: OperatorProcess, session_conversion: ConversionServer,
        release: str, namespace: str) -> None:  # noqa: F811 -- the imported fixture
    values = ["--set", f"operator.watchNamespace={release}", "--set", "operator.replicas=1",
              "--set", "operator.peering=false", "--skip-crds"]
    as_shipped(cluster)
    adopt_crds(cluster, "up", release)
    helm(cluster, "install", "up", str(RELEASED), "-n", release, *values)
    assert served(cluster) == {"v1alpha1": (True, True), "v1beta1": (True, False)}
    rendered = converting_through(cluster, session_conversion)

    # Under 0.2.0: written at v1alpha1, held at v1alpha1, sized by the
    # operator (which reads v1beta1: converted, as 0.2.0's own does not need).
    def create(body: dict[str, Any]) -> None:
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(body))
    create(policy("units", **UNITS))
    create(policy("llama", model={"checkpointBytes": "5.67TB"}, writers=1))
    for name in NAMES:
        wait_for(lambda n=name: read(cluster, namespace, ALPHA, n).get("status", {})
                 .get("phase"), what=f"{name} sized")
        assert etcd_version(cluster, namespace, name) == ALPHA
    assert "v1alpha1" in crd(cluster)["status"]["storedVersions"]

    # No operator across the upgrade, as while the chart's replicas roll:
    # nothing writes the policies, so the CRD's flip alone is seen to
    # rewrite nothing (test_storage_rewrite.py proves the migration's own
    # writes re-encode, where no operator ever runs).
    operator.stop()
    as_rendered(cluster, rendered)
    helm(cluster, "upgrade", "up", str(repo_root() / "charts" / "ckptdrain"), "-n", release,
         *values)
    assert served(cluster) == {"v1alpha1": (True, False), "v1beta1": (True, True)}
    converting_through(cluster, session_conversion)
    assert {name: etcd_version(cluster, namespace, name) for name in NAMES} == {
        name: ALPHA for name in NAMES}
    assert sorted(crd(cluster)["status"]["storedVersions"]) == ["v1alpha1", "v1beta1"]
    listed = len(json.loads(cluster.kubectl("get", resource(BETA), "-A", "-o", "json")
                            .stdout)["items"])
    assert listed >= len(NAMES)

    # The operator's leader migrates: every object rewritten (or written
    # by the operator's own reconcile first: a conflict), then
    # storedVersions trimmed; etcd really holds each at v1beta1.
    operator.start()
    wait_for(lambda: crd(cluster)["status"]["storedVersions"] == ["v1beta1"], timeout_s=90,
             what="the operator to migrate and trim storedVersions")
    assert {name: etcd_version(cluster, namespace, name) for name in NAMES} == {
        name: BETA for name in NAMES}
    # The count is logged just after the trim's PATCH returns, so it may
    # trail the storedVersions the wait above saw.
    wait_for(lambda: ("storage migration of checkpointpolicies.ckptdrain.io: "
                      f"every object ({listed}) rewritten at v1beta1")
             in operator.log.read_text(), timeout_s=10, what="the migration's count logged")

    # Both versions read back, the converter's values exactly; v1alpha1
    # keeps every value (1d comes back 24h: docs/api-versions.md).
    for name in NAMES:
        alpha, beta = same_moment(cluster, namespace, name)
        assert (beta["spec"], beta.get("status")) == (
            convert(copy.deepcopy(alpha), BETA)["spec"],
            convert(copy.deepcopy(alpha), BETA).get("status"))
    units = read(cluster, namespace, BETA, "units")["spec"]
    assert (units["model"]["parameters"], units["mtti"], units["overlap"]) == (
        "405G", "24h", "10%")

    # The operator still reconciles (a v1beta1 write) and injects.
    generation = read(cluster, namespace, BETA, "units")["metadata"]["generation"]
    cluster.kubectl("patch", "-n", namespace, resource(BETA), "units", "--type=merge",
                    "-p", json.dumps({"spec": {"interval": "30m", "mtti": "36h"}}))
    status = wait_for(lambda: (s := read(cluster, namespace, BETA, "units")["status"])
                      .get("observedGeneration") == generation + 1 and s,
                      what="the operator to reconcile the v1beta1 write")
    assert status["requiredBandwidthBytes"] == 31_500_000_000  # 5.67 TB in 30 m at 10%
    made = cluster.kubectl("create", "-n", namespace, "-o", "json", "-f", "-", input=json.dumps(
        pod("u-0", {"app": "units", **INJECT}, 0, terminationGracePeriodSeconds=3600)))
    names = [c["name"] for c in json.loads(made.stdout)["spec"].get("initContainers", [])]
    assert "ckptdrain-agent" in names, names

    # The rollback to 0.2.0 (storage v1alpha1 again) reads what this
    # release stored, at both versions, through /convert.
    as_rendered(cluster, rendered)
    helm(cluster, "upgrade", "up", str(RELEASED), "-n", release, *values)
    assert served(cluster) == {"v1alpha1": (True, True), "v1beta1": (True, False)}
    converting_through(cluster, session_conversion)
    for name in NAMES:
        assert etcd_version(cluster, namespace, name) == BETA  # nobody wrote it since
        alpha, beta = same_moment(cluster, namespace, name)
        assert alpha["spec"] == convert(copy.deepcopy(beta), ALPHA)["spec"]
    assert read(cluster, namespace, ALPHA, "units")["spec"]["mtti"] == "36h"

    cluster.kubectl("delete", "-n", namespace, f"pods,{resource(ALPHA)}", "--all",
                    "--wait=false")
