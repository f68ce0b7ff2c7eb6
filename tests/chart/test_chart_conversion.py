"""The CheckpointPolicy CRD's conversion webhook as the chart renders it: the
release's own webhook Service, namespace, port and path (crds/ names the
default install's), and its CA from cainjector with cert-manager, else from
the operator, which is then granted that one CRD."""

from __future__ import annotations

import io

import pytest
import yaml
from tests.chart.support import CHART, CRDS, Tools

pytestmark = pytest.mark.cluster  # helm, built by `make servers`

POLICY_CRD = "checkpointpolicies.ckptdrain.io"


def _render(tools: Tools, release: str, namespace: str, *args: str) -> list[dict]:
    text = tools.run("helm", "template", release, str(CHART), "--namespace", namespace,
                     *args).stdout
    return [d for d in yaml.safe_load_all(io.StringIO(text)) if d]


def _crd(objects: list[dict], name: str = POLICY_CRD) -> dict:
    return next(o for o in objects
                if o["kind"] == "CustomResourceDefinition" and o["metadata"]["name"] == name)


def _service(objects: list[dict]) -> dict:
    """The webhook Service (the one the webhook configurations call)."""
    hooks = next(o for o in objects if o["kind"] == "MutatingWebhookConfiguration")
    name = hooks["webhooks"][0]["clientConfig"]["service"]["name"]
    return next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == name)


@pytest.mark.parametrize(("release", "namespace", "service"), [
    ("ckptdrain", "ckptdrain", "ckptdrain-webhook"),
    ("train", "ml-ops", "train-ckptdrain-webhook"),
])
def test_the_crd_converts_through_the_releases_webhook_service(
        tools: Tools, release: str, namespace: str, service: str) -> None:
    objects = _render(tools, release, namespace)
    conversion = _crd(objects)["spec"]["conversion"]
    assert conversion["strategy"] == "Webhook"
    assert conversion["webhook"]["conversionReviewVersions"] == ["v1"]
    port = _service(objects)["spec"]["ports"][0]["port"]
    assert _service(objects)["metadata"]["name"] == service
    assert conversion["webhook"]["clientConfig"] == {"service": {
        "namespace": namespace, "name": service, "path": "/convert", "port": port}}
    # No CA rendered: the operator keeps it, so every render is the same.
    assert "cert-manager.io/inject-ca-from" not in _crd(objects)["metadata"]["annotations"]
    # Only that CRD converts.
    for other in ("checkpoints.ckptdrain.io", "checkpointshares.ckptdrain.io"):
        assert "conversion" not in _crd(objects, other)["spec"]


@pytest.mark.parametrize("args", [(), ("--set", "certManager.enabled=true")])
def test_the_release_serves_both_versions_and_stores_v1beta1(
        tools: Tools, args: tuple[str, ...]) -> None:
    """v1beta1 is stored from 0.3.0; v1alpha1 still served, converted
    through the webhook (docs/api-versions.md)."""
    crd = _crd(_render(tools, "train", "ml-ops", *args))
    served = {v["name"]: (v["served"], v["storage"]) for v in crd["spec"]["versions"]}
    assert served == {"v1alpha1": (True, False), "v1beta1": (True, True)}
    assert crd["spec"]["conversion"]["strategy"] == "Webhook"
    assert crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]["path"] == "/convert"


def test_crds_dir_names_the_default_install() -> None:
    """A raw `kubectl apply -f crds/` beside the default install (release
    ckptdrain in ckptdrain) converts through that install's Service."""
    source = next(d for d in yaml.safe_load_all((CRDS / "checkpointpolicies.yaml").read_text())
                  if d)
    assert source["spec"]["conversion"]["webhook"]["clientConfig"] == {"service": {
        "namespace": "ckptdrain", "name": "ckptdrain-webhook", "path": "/convert",
        "port": 443}}


def test_the_conversion_path_is_a_value(tools: Tools) -> None:
    objects = _render(tools, "ckptdrain", "ckptdrain", "--set", "webhook.conversionPath=/c2")
    service = _crd(objects)["spec"]["conversion"]["webhook"]["clientConfig"]["service"]
    assert service["path"] == "/c2"
    refused = tools.run("helm", "template", "ckptdrain", str(CHART),
                        "--set", "webhook.conversionPath=convert", check=False)
    assert refused.returncode != 0 and "conversionPath" in refused.stderr, refused.stderr


def test_cert_manager_injects_the_crds_ca_and_the_operator_gets_no_crd_right(
        tools: Tools) -> None:
    objects = _render(tools, "train", "ml-ops", "--set", "certManager.enabled=true")
    annotations = _crd(objects)["metadata"]["annotations"]
    certificate = next(o for o in objects if o["kind"] == "Certificate")
    assert annotations["cert-manager.io/inject-ca-from"] == (
        f"ml-ops/{certificate['metadata']['name']}")
    assert "caBundle" not in _crd(objects)["spec"]["conversion"]["webhook"]["clientConfig"]
    # The storage version migration's rights alone: no patch of the CRD.
    assert _crd_rules(objects) == MIGRATION_RULES


#: What the leader's storage version migration needs (docs/rbac.md): the
#: CRD read by name, its status patched (status.storedVersions).
MIGRATION_RULES = [
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
     "resourceNames": [POLICY_CRD], "verbs": ["get"]},
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions/status"],
     "resourceNames": [POLICY_CRD], "verbs": ["patch"]}]


def _crd_rules(objects: list[dict]) -> list[dict]:
    """The rules of the operator's roles that name CRDs (or their status) by name."""
    return [rule for o in objects if o["kind"] in ("Role", "ClusterRole")
            for rule in o.get("rules") or []
            if any(r.partition("/")[0] == "customresourcedefinitions" for r in rule["resources"])
            and rule.get("resourceNames")]


def test_the_operator_may_patch_that_one_crd_when_it_keeps_the_ca(tools: Tools) -> None:
    rules = _crd_rules(_render(tools, "train", "ml-ops"))
    assert rules == [{"apiGroups": ["apiextensions.k8s.io"],
                      "resources": ["customresourcedefinitions"],
                      "resourceNames": [POLICY_CRD], "verbs": ["get", "patch"]},
                     *MIGRATION_RULES]


def test_an_operator_watching_one_namespace_gets_no_migration_right(tools: Tools) -> None:
    """It cannot see every policy, so it never trims storedVersions."""
    rules = _crd_rules(_render(tools, "train", "ml-ops", "--set", "certManager.enabled=true",
                               "--set", "operator.watchNamespace=ml"))
    assert rules == []


def test_admission_outside_its_own_process_is_refused(tools: Tools) -> None:
    """The operator's own process (Kopf's server) has no conversion route:
    with it every unversioned `kubectl get ckpol` would fail, so the chart
    says so at install instead."""
    result = tools.run("helm", "template", "ckptdrain", str(CHART),
                       "--set", "webhook.ownProcess=false", check=False)
    assert result.returncode != 0
    assert "webhook.ownProcess must be true" in result.stderr
    assert "conversion webhook" in result.stderr


@pytest.mark.parametrize(("key", "value"), [
    ("mutatePodsPath", "/convert"),
    ("validatePoliciesPath", "/convert/"),  # the server trims the slashes
    ("mutatePoliciesPath", "/convert"),
])
def test_the_conversion_path_may_not_be_an_admission_path(
        tools: Tools, key: str, value: str) -> None:
    """The admission server routes the conversion path first: an admission
    webhook there would get ConversionReviews back."""
    refused = tools.run("helm", "template", "ckptdrain", str(CHART),
                        "--set", f"webhook.{key}={value}", check=False)
    assert refused.returncode != 0
    assert f"webhook.conversionPath (/convert) must differ from webhook.{key}" in (
        refused.stderr), refused.stderr


@pytest.mark.parametrize("key", ["conversionPath", "mutatePodsPath", "validatePoliciesPath",
                                 "mutatePoliciesPath"])
@pytest.mark.parametrize("value", ["/convert?v=1", "/convert#top", "/", "//x"])
def test_a_webhook_path_is_a_path_only(tools: Tools, key: str, value: str) -> None:
    """A query or fragment passes no webhook path: the operator refuses it at
    start (CKPTDRAIN_CONVERSION_PATH), the apiserver in a clientConfig; the
    chart's schema refuses it at install instead."""
    refused = tools.run("helm", "template", "ckptdrain", str(CHART),
                        "--set", f"webhook.{key}={value}", check=False)
    assert refused.returncode != 0
    assert key in refused.stderr and "does not match pattern" in refused.stderr, (
        refused.stderr)

