"""What a GitOps pipeline gets from the chart: `helm template` with no
cluster to ask (Argo CD, Flux, a CI job). The chart states the Kubernetes
release its defaults need, renders its admission policies from values alone,
and marks every CRD it ships so that no tool prunes or deletes it."""

from __future__ import annotations

import io
import json
import re
import subprocess

import pytest
import yaml
from tests.chart.support import CHART, REPO, Tools

pytestmark = pytest.mark.cluster  # helm, built by `make servers`

#: The oldest release with everything the defaults use on by default: the
#: preStop sleep action (operator.shutdownDelaySeconds) and
#: admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy.
OLDEST = "1.30.0"
#: Client-side apply (kubectl apply, Argo CD without ServerSideApply) copies
#: the object into an annotation, and annotations stop at 256 KiB in all.
CRD_BUDGET = 200 * 1024


def render(tools: Tools, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return tools.run("helm", "template", "ckptdrain", str(CHART), "--namespace", "ckptdrain",
                     *args, check=check)


def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(io.StringIO(text)) if d]


def _crds(tools: Tools, *args: str) -> list[dict]:
    return [d for d in _docs(render(tools, "--include-crds", *args).stdout)
            if d["kind"] == "CustomResourceDefinition"]


def _sync_options(crd: dict) -> set[str]:
    value = crd["metadata"].get("annotations", {}).get("argocd.argoproj.io/sync-options", "")
    return {o.strip() for o in value.split(",") if o.strip()}


def test_the_chart_asks_for_the_release_its_defaults_need(tools: Tools) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={OLDEST}-0"
    # What makes 1.30 the floor is in the default render.
    objects = _docs(render(tools, "--kube-version", OLDEST).stdout)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert "sleep" in deployment["spec"]["template"]["spec"]["containers"][0]["lifecycle"][
        "preStop"]
    assert any(o["apiVersion"] == "admissionregistration.k8s.io/v1"
               and o["kind"] == "ValidatingAdmissionPolicy" for o in objects)
    older = render(tools, "--kube-version", "1.29.15", check=False)
    assert older.returncode != 0, "the chart installs on 1.29"
    assert f"chart requires kubeVersion: >={OLDEST}-0" in older.stderr, older.stderr


def test_the_clusters_we_test_on_meet_the_chart(tools: Tools) -> None:
    """The e2e clusters (our own build and kind) run a release the chart
    accepts, so the chart they install is the one users get."""
    from tests.support import apiserver
    pinned = re.search(r'K8S_VERSION="\$\{K8S_VERSION:-(v[0-9.]+)\}"',
                       (REPO / "e2e" / "cluster" / "lib.sh").read_text())
    kind = re.search(r"kindest/node:(v[0-9.]+)", (REPO / "e2e" / "kind" / "cluster.yaml")
                     .read_text())
    assert pinned and kind
    for version in {apiserver.K8S_VERSION, pinned[1], kind[1]}:
        render(tools, "--kube-version", version)


def test_no_template_asks_what_the_cluster_serves() -> None:
    """`helm template` knows no cluster: a template deciding by the API
    versions Helm reports silently drops objects from GitOps renders."""
    for template in sorted((CHART / "templates").iterdir()):
        assert "Capabilities" not in template.read_text(), template.name


def test_the_admission_policies_render_without_a_cluster(tools: Tools) -> None:
    """Plain `helm template`, nothing said of the cluster: the agent's pod
    patch policy, the recency write policy and (with the CSI driver) the
    policy on its free-space reports by default, the operator's Secret and
    write policies with the peer tier."""
    names = sorted(o["metadata"]["name"] for o in _docs(render(
        tools, "--set", "operator.peerTier=true").stdout)
        if o["kind"] == "ValidatingAdmissionPolicy")
    assert names == ["ckptdrain-agent-pod-patch", "ckptdrain-csi-capacity-report",
                     "ckptdrain-operator-writes", "ckptdrain-recency-writes",
                     "ckptdrain-secret-update"]


def test_every_crd_is_kept_by_helm_argo_cd_and_flux(tools: Tools) -> None:
    crds = _crds(tools)
    assert {c["spec"]["group"] for c in crds} == {"ckptdrain.io", "kopf.dev"}
    for crd in crds:
        name, annotations = crd["metadata"]["name"], crd["metadata"]["annotations"]
        # A Flux Kustomization applying the rendered manifests.
        assert annotations.get("kustomize.toolkit.fluxcd.io/prune") == "disabled", name
        if crd["spec"]["group"] == "ckptdrain.io":
            # Helm, and Argo CD (>= 2.7) on deleting the Application.
            assert annotations.get("helm.sh/resource-policy") == "keep", name
            # Argo CD when the CRD leaves the render; applied server-side.
            assert {"Prune=false", "ServerSideApply=true"} <= _sync_options(crd), name
        else:
            # Kopf's, shared by every Kopf operator: never pruned nor deleted.
            assert {"Prune=false", "Delete=false"} <= _sync_options(crd), name


def test_crds_keep_false_lets_every_tool_delete_ours(tools: Tools) -> None:
    for crd in _crds(tools, "--set", "crds.keep=false"):
        if crd["spec"]["group"] != "ckptdrain.io":
            continue
        annotations = crd["metadata"]["annotations"]
        assert annotations.get("helm.sh/resource-policy") != "keep"
        assert "kustomize.toolkit.fluxcd.io/prune" not in annotations
        assert _sync_options(crd) == {"ServerSideApply=true"}


def test_each_crd_fits_client_side_apply(tools: Tools) -> None:
    """What kubectl writes into last-applied-configuration (compact JSON)."""
    for crd in _crds(tools):
        size = len(json.dumps(crd, separators=(",", ":")).encode())
        assert size < CRD_BUDGET, f"{crd['metadata']['name']}: {size} bytes"
