"""Upgrades and GitOps open no gap: every render is the same (no certificate
is made by the chart), the operator makes and keeps its webhook certificate
and caBundle, a real `helm upgrade` leaves both alone and upgrades the CRDs,
`helm uninstall` keeps the CRDs, and the CRDs still have one source."""

from __future__ import annotations

import base64
import copy
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from tests.chart.support import CHART, CRDS, Tools, adopt_crds
from tests.support.apiserver import Cluster, free_port

pytestmark = pytest.mark.cluster

OURS = "ckptdrain.io"
# What the template adds besides Helm's labels (test_chart_gitops.py).
ADDED = {"helm.sh/resource-policy", "argocd.argoproj.io/sync-options",
         "kustomize.toolkit.fluxcd.io/prune"}
#: The chart's admission webhooks: pods (mutate), policies (mutate: the
#: default class; validate).
WEBHOOKS = 3


def _render(tools: Tools, *args: str) -> str:
    return tools.run("helm", "template", "ckptdrain", str(CHART), "--namespace", "ckptdrain",
                     *args).stdout


def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(io.StringIO(text)) if d]


@pytest.mark.parametrize("args", [[], ["--set", "certManager.enabled=true"]])
def test_every_render_is_the_same(tools: Tools, args: list[str]) -> None:
    """What Argo CD and Flux do on every sync: render again. Nothing may differ
    (a new CA each time would roll the operator and break the caBundle)."""
    first = _render(tools, "--include-crds", *args)
    assert first == _render(tools, "--include-crds", *args)
    # Nor may a template ask the cluster or the clock (lookup is empty under
    # `helm template`; the rest differ per render). One lookup is allowed:
    # the release namespace's, which only feeds a `fail` (csi-driver.yaml),
    # never what is rendered.
    actions = re.compile(r"\{\{[^}]*\b(lookup(?! \"v1\" \"Namespace\" \"\" \.Release\.Namespace)|"
                         r"genCA|genSelfSignedCert|genSignedCert|"
                         r"randAlpha\w*|randAscii|uuidv4|now)\b[^}]*\}\}")
    for template in (CHART / "templates").iterdir():
        found = actions.search(template.read_text())
        assert found is None, (template.name, found and found.group(0))


def test_crds_have_one_source(tools: Tools, tmp_path: Path) -> None:
    """crds/ at the repository top is the only copy: the chart templates the
    ckptdrain.io CRDs from it (kept on uninstall) and ships Kopf's peering CRDs
    from it in its crds/, also in a packaged chart (links resolved)."""
    link = CHART / "files" / "crds"
    assert link.is_symlink() and link.resolve() == CRDS.resolve(), (
        "charts/ckptdrain/files/crds must be a symlink to ../../../crds (one source)")
    peering = CHART / "crds" / "kopf-peering.yaml"
    assert peering.is_symlink() and peering.resolve() == (CRDS / "kopf-peering.yaml").resolve()
    assert [p.name for p in (CHART / "crds").iterdir()] == ["kopf-peering.yaml"]

    sources = [d for p in sorted(CRDS.glob("*.yaml")) for d in _docs(p.read_text())]
    ours = {d["metadata"]["name"]: d for d in sources if d["spec"]["group"] == OURS}
    assert sorted(ours) == ["checkpointclasses.ckptdrain.io", "checkpointpolicies.ckptdrain.io",
                           "checkpoints.ckptdrain.io", "checkpointshares.ckptdrain.io"]
    rendered = {d["metadata"]["name"]: d for d in _docs(_render(tools))
                if d["kind"] == "CustomResourceDefinition"}
    assert set(rendered) == set(ours)
    for name, source in ours.items():
        got = copy.deepcopy(rendered[name])
        assert got["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        annotations = {k: v for k, v in got["metadata"].pop("annotations").items()
                       if k not in ADDED}
        got["metadata"].pop("labels")
        assert annotations == (source["metadata"].get("annotations") or {}), name
        source = {**source, "metadata": {k: v for k, v in source["metadata"].items()
                                         if k not in ("annotations", "labels")}}
        assert got == source, f"{name}: the rendered CRD differs from crds/"
    assert not any(d["kind"] == "CustomResourceDefinition"
                   for d in _docs(_render(tools, "--set", "crds.install=false")))
    shown = tools.run("helm", "show", "crds", str(CHART)).stdout
    assert shown.strip() == (CRDS / "kopf-peering.yaml").read_text().strip()

    tools.run("helm", "package", str(CHART), "--destination", str(tmp_path))
    (package,) = tmp_path.glob("ckptdrain-*.tgz")
    with tarfile.open(package) as tar:
        packaged = {m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
                    for m in tar.getmembers() if m.isfile()}
    for path in sorted(CRDS.glob("*.yaml")):
        assert packaged[f"ckptdrain/files/crds/{path.name}"] == path.read_bytes()
    assert packaged["ckptdrain/crds/kopf-peering.yaml"] == (CRDS / "kopf-peering.yaml"
                                                            ).read_bytes()


def _json(cluster: Cluster, *args: str) -> dict:
    return dict(json.loads(cluster.kubectl("get", *args, "-o", "json").stdout))


def _ca_bundles(cluster: Cluster, name: str) -> list[str | None]:
    return [h["clientConfig"].get("caBundle")
            for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
            for h in _json(cluster, kind, name)["webhooks"]]


def _crd_ca_bundle(cluster: Cluster) -> str | None:
    """The CheckpointPolicy CRD's conversion caBundle."""
    crd = _json(cluster, "crd", "checkpointpolicies.ckptdrain.io")
    return crd["spec"]["conversion"]["webhook"]["clientConfig"].get("caBundle")


def _wait(check: object, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_certificate_and_crds_through_a_real_upgrade(tools: Tools, cluster: Cluster,
                                                         tmp_path: Path) -> None:
    env, namespace, release = cluster.env(), "ckptdrain-lc", "lc"
    fullname = f"{release}-ckptdrain"
    cluster.kubectl("create", "namespace", namespace)
    adopt_crds(cluster, release, namespace)
    tools.run("helm", "install", release, str(CHART), "-n", namespace, env=env)
    secret_name = f"{fullname}-webhook-cert"
    assert not _json(cluster, "secret", "-n", namespace, secret_name).get("data")
    assert _ca_bundles(cluster, fullname) == [None] * WEBHOOKS
    # The CRD converts through this release's webhook Service.
    service = _json(cluster, "crd", "checkpointpolicies.ckptdrain.io")["spec"]["conversion"][
        "webhook"]["clientConfig"]["service"]
    assert (service["namespace"], service["name"]) == (namespace, f"{fullname}-webhook")
    assert _crd_ca_bundle(cluster) is None

    # The operator as the chart configures it (the test API server runs no
    # pods): it makes the CA and certificate and sets both caBundles.
    log = open(tmp_path / "operator.log", "wb")  # noqa: SIM115 -- closed below
    operator = subprocess.Popen(
        [sys.executable, "-m", "ckptdrain.operator.main", "--standalone"],
        env={**os.environ, **env, "CKPTDRAIN_WEBHOOK_SECRET": f"{namespace}/{secret_name}",
             "CKPTDRAIN_WEBHOOK_CONFIGS": fullname,
             "CKPTDRAIN_WEBHOOK_HOST": f"{fullname}-webhook.{namespace}.svc",
             "CKPTDRAIN_WEBHOOK_ADDR": "127.0.0.1", "CKPTDRAIN_WEBHOOK_PORT": str(free_port()),
             "CKPTDRAIN_METRICS_PORT": "0", "CKPTDRAIN_HEALTH_PORT": "0"},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def made() -> bool:
            data = _json(cluster, "secret", "-n", namespace, secret_name).get("data") or {}
            return set(data) == {"ca.crt", "ca.key", "tls.crt", "tls.key"} and \
                _ca_bundles(cluster, fullname) == [data["ca.crt"]] * WEBHOOKS and \
                _crd_ca_bundle(cluster) == data["ca.crt"]
        _wait(made, "the operator to make the certificate and set every caBundle, "
                    "the CRD's conversion one too")
        data = _json(cluster, "secret", "-n", namespace, secret_name)["data"]
        _verify(data, f"{fullname}-webhook.{namespace}.svc")
        # A restart reuses it: no new CA, no caBundle churn.
        operator.terminate()
        operator.wait(30)
    finally:
        if operator.poll() is None:
            operator.kill()
            operator.wait()
        log.close()

    # A real upgrade that changes the webhooks: Helm's three-way merge leaves
    # the caBundle the operator set (the chart never renders one) and the
    # Secret's data alone.
    tools.run("helm", "upgrade", release, str(CHART), "-n", namespace,
              "--set", "webhook.timeoutSeconds=7", env=env)
    hooks = _json(cluster, "mutatingwebhookconfiguration", fullname)["webhooks"]
    assert hooks[0]["timeoutSeconds"] == 7
    assert _ca_bundles(cluster, fullname) == [data["ca.crt"]] * WEBHOOKS
    assert _crd_ca_bundle(cluster) == data["ca.crt"]
    assert _json(cluster, "secret", "-n", namespace, secret_name)["data"] == data

    # A CRD changed in a new chart version reaches the API server on upgrade.
    newer = tmp_path / "chart"
    shutil.copytree(CHART, newer, symlinks=False)
    crd = newer / "files" / "crds" / "checkpoints.yaml"
    crd.write_text(crd.read_text().replace("shortNames: [ckpt]", "shortNames: [ckpt, ckpts]"))
    tools.run("helm", "upgrade", release, str(newer), "-n", namespace, env=env)
    names = _json(cluster, "crd", "checkpoints.ckptdrain.io")["spec"]["names"]
    assert names["shortNames"] == ["ckpt", "ckpts"]

    tools.run("helm", "uninstall", release, "-n", namespace, env=env)
    # Kept: deleting a CRD would delete every policy and record.
    for name in ("checkpointpolicies.ckptdrain.io", "checkpoints.ckptdrain.io"):
        cluster.kubectl("get", "crd", name)


def _verify(data: dict[str, str], dns_name: str) -> None:
    """The serving certificate is for the Service's name and chains to the CA
    in the caBundle: what the API server checks."""
    with tempfile.TemporaryDirectory() as directory:
        d = Path(directory)
        for key in ("ca.crt", "tls.crt"):
            (d / key).write_bytes(base64.b64decode(data[key]))
        verified = subprocess.run(["openssl", "verify", "-CAfile", str(d / "ca.crt"),
                                   "-verify_hostname", dns_name, str(d / "tls.crt")],
                                  capture_output=True, text=True)
        assert verified.returncode == 0, verified.stdout + verified.stderr


def _webhook_configuration(kind: str, name: str) -> dict:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": name},
            "webhooks": [{"name": f"probe.{name}.ckptdrain.io", "sideEffects": "None",
                          "admissionReviewVersions": ["v1"], "failurePolicy": "Ignore",
                          "clientConfig": {"service": {"namespace": "default", "name": name,
                                                       "path": "/probe"}},
                          "rules": [{"apiGroups": ["ckptdrain.io"], "apiVersions": ["*"],
                                     "resources": ["nothing"], "operations": ["CREATE"]}]}]}


def test_configurations_created_after_the_operator_get_their_ca_bundle_at_once(
        cluster: Cluster, tmp_path: Path) -> None:
    """Helm creates the webhook configurations after the Deployment, so the
    operator may start first; it must not leave them without a caBundle (no
    admission at all) until its next periodic check, 30 s later."""
    name, namespace = "late-ckptdrain", "ckptdrain-late"
    cluster.kubectl("create", "namespace", namespace)
    log = open(tmp_path / "operator.log", "wb")  # noqa: SIM115 -- closed below
    operator = subprocess.Popen(
        [sys.executable, "-m", "ckptdrain.operator.main", "--standalone"],
        env={**os.environ, **cluster.env(),
             "CKPTDRAIN_WEBHOOK_SECRET": f"{namespace}/{name}-webhook-cert",
             "CKPTDRAIN_WEBHOOK_CONFIGS": name,
             "CKPTDRAIN_WEBHOOK_HOST": f"{name}-webhook.{namespace}.svc",
             "CKPTDRAIN_WEBHOOK_ADDR": "127.0.0.1", "CKPTDRAIN_WEBHOOK_PORT": str(free_port()),
             "CKPTDRAIN_METRICS_PORT": "0", "CKPTDRAIN_HEALTH_PORT": "0"},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def certificate() -> bool:
            found = cluster.kubectl("get", "secret", "-n", namespace, f"{name}-webhook-cert",
                                    "-o", "json", check=False)
            return found.returncode == 0 and bool(json.loads(found.stdout).get("data"))
        _wait(certificate, "the operator's certificate Secret", timeout_s=60)
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            cluster.kubectl("create", "-f", "-",
                            input=json.dumps(_webhook_configuration(kind, name)))
        # Well within the 30 s periodic check.
        _wait(lambda: all(_ca_bundles(cluster, name)), "both caBundles", timeout_s=10)
    finally:
        if operator.poll() is None:
            operator.terminate()
            try:
                operator.wait(30)
            except subprocess.TimeoutExpired:
                operator.kill()
                operator.wait()
        log.close()
        for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
            cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)
