"""The operator keeps the CheckpointPolicy CRD's conversion caBundle
(tls/webhook_certs.py's CrdCaKeeper) on a real apiserver, with only the
rights docs/rbac.md grants: it puts its own CA back after a reset, leaves a
CRD that calls another release's Service alone, names the right it lacks,
and leaves alone a CRD that is missing or has no conversion webhook. The
apiserver, CRD and webhook are this directory's (conftest.py)."""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_helpers import wait_for
from conversion_objects import ALPHA, CRD, alpha_policy, read
from kubernetes import client, config
from operator_process import repo_root

from ckptdrain.operator.tls import webhook_certs
from ckptdrain.operator.tls.webhook_address import WebhookAddress
from ckptdrain.operator.tls.webhook_certs import CrdCa
from support.apiserver import Cluster
from support.conversion_server import ConversionServer


def _documented_crd_rule() -> dict[str, Any]:
    """The operator's rule on CRDs by name, as docs/rbac.md grants it."""
    text = (repo_root() / "docs" / "rbac.md").read_text()
    rules = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", text, re.S)[0])["rules"]
    (rule,) = [r for r in rules if "customresourcedefinitions" in r["resources"]
               and r.get("resourceNames") and "patch" in r["verbs"]]
    return dict(rule)


def _crds_as(cluster: Cluster, kubeconfig: Path | None) -> Callable[[], Any]:
    api = client.ApiextensionsV1Api(config.new_client_from_config(
        str(kubeconfig or cluster.kubeconfig)))
    return lambda: api


def _ca_bundle(cluster: Cluster) -> str | None:
    crd = json.loads(cluster.kubectl("get", "crd", CRD, "-o", "json").stdout)
    return crd["spec"]["conversion"]["webhook"]["clientConfig"].get("caBundle")


def _service_account(cluster: Cluster, namespace: str, rules: list[dict[str, Any]]) -> Path:
    """A kubeconfig of a service account granted `rules` (cluster-wide)."""
    account = "ckptdrain-operator"
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": account, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": f"{namespace}-crd"}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{namespace}-crd"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": f"{namespace}-crd"},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]}]
    cluster.kubectl("apply", "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": objects}))
    return Path(cluster.kubeconfig_for(namespace, account))


def _said(caplog: pytest.LogCaptureFixture, about: str) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if about in r.getMessage()]


def test_the_operator_puts_the_crds_conversion_ca_bundle_back(
        own_cluster: Cluster, server: ConversionServer, namespace: str,
        certificates: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """With exactly the documented rule: a caBundle reset to another CA
    (a GitOps sync, `helm upgrade --force`) breaks v1alpha1 reads until the
    operator's certificate manager sets its own CA again."""
    own_cluster.kubectl("create", "-n", namespace, "-f", "-",
                        input=json.dumps(alpha_policy("ca")))
    monkeypatch.setattr(webhook_certs, "_crds", _crds_as(own_cluster, _service_account(
        own_cluster, namespace, [_documented_crd_rule()])))
    ours = certificates["ca"].read_bytes()
    logger = logging.getLogger("ckptdrain.test.conversion")
    # The CRD calls the server by URL: this replica is that host and port.
    keeper = webhook_certs.CrdCaKeeper(WebhookAddress("127.0.0.1", server.port), logger)

    reset = base64.b64encode(certificates["other_ca"].read_bytes()).decode()
    own_cluster.kubectl("patch", "crd", CRD, "--type=merge", "-p", json.dumps(
        {"spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": reset}}}}}))
    wait_for(lambda: read(own_cluster, namespace, ALPHA, "ca", check=False).returncode != 0,
             what="v1alpha1 reads (converted: v1beta1 is stored) to fail with a CA that did "
                  "not sign the webhook's certificate")

    assert keeper.keep(ours) is CrdCa.SET
    assert _ca_bundle(own_cluster) == base64.b64encode(ours).decode()
    assert keeper.keep(ours) is CrdCa.IN_STEP
    wait_for(lambda: read(own_cluster, namespace, ALPHA, "ca", check=False).returncode == 0,
             what="v1alpha1 reads with the operator's CA back")
    # Only the caBundle changed: the URL and the rest are the chart's.
    crd = json.loads(own_cluster.kubectl("get", "crd", CRD, "-o", "json").stdout)
    assert crd["spec"]["conversion"]["webhook"]["clientConfig"]["url"].endswith("/convert")

    # No other CRD: refused, and said at every check (a right is lacking,
    # nothing that retrying fixes), naming the right.
    caplog.set_level(logging.DEBUG, logger=logger.name)
    other = "checkpoints.ckptdrain.io"
    refused = webhook_certs.CrdCaKeeper(WebhookAddress("127.0.0.1", server.port), logger,
                                        crd=other)
    assert [refused.keep(ours), refused.keep(ours)] == [CrdCa.FORBIDDEN] * 2
    said = _said(caplog, other)
    assert [level for level, _ in said] == [logging.WARNING] * 2, said
    assert f"may not get customresourcedefinitions {other}" in said[0][1]
    assert "reads of v1alpha1" in said[0][1]
    assert webhook_certs.next_check_s(0, CrdCa.FORBIDDEN) == webhook_certs.CHECK_S


#: A CRD of its own for the keeper's Service cases: the apiserver never
#: calls its webhook (nothing reads it), so no Service need answer.
WIDGETS = "widgets.keeper.ckptdrain.io"


def _widgets(namespace: str, name: str) -> dict[str, Any]:
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": WIDGETS},
            "spec": {"group": "keeper.ckptdrain.io", "scope": "Namespaced",
                     "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": schema},
                                  {"name": "v2", "served": True, "storage": False,
                                   "schema": schema}],
                     "conversion": {"strategy": "Webhook", "webhook": {
                         "conversionReviewVersions": ["v1"],
                         "clientConfig": {"service": {"namespace": namespace, "name": name,
                                                      "path": "/convert", "port": 443}}}}}}


def _widgets_state(cluster: Cluster) -> tuple[str | None, str]:
    crd = json.loads(cluster.kubectl("get", "crd", WIDGETS, "-o", "json").stdout)
    return (crd["spec"]["conversion"]["webhook"]["clientConfig"].get("caBundle"),
            crd["metadata"]["resourceVersion"])


def test_the_keeper_sets_the_ca_only_where_the_crd_calls_its_own_service(
        own_cluster: Cluster, server: ConversionServer, certificates: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Two releases in one cluster (the second with crds.install=false):
    the CRD calls the first's Service, and the second's replicas leave its
    caBundle alone, saying so once per Service, instead of taking turns
    with the first every check."""
    monkeypatch.setattr(webhook_certs, "_crds", _crds_as(own_cluster, None))
    caplog.set_level(logging.DEBUG, logger="ckptdrain.test.conversion")
    logger = logging.getLogger("ckptdrain.test.conversion")
    ours, theirs = certificates["ca"].read_bytes(), certificates["other_ca"].read_bytes()
    own_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                        input=json.dumps(_widgets("team-a", "a-ckptdrain-webhook")))
    try:
        first = webhook_certs.CrdCaKeeper(
            WebhookAddress("a-ckptdrain-webhook.team-a.svc", 9443), logger, crd=WIDGETS)
        second = webhook_certs.CrdCaKeeper(
            WebhookAddress("b-ckptdrain-webhook.team-b.svc", 9443), logger, crd=WIDGETS)
        assert first.keep(ours) is CrdCa.SET
        set_at = _widgets_state(own_cluster)
        assert set_at[0] == base64.b64encode(ours).decode()
        assert [second.keep(theirs) for _ in range(3)] == [CrdCa.NOT_OURS] * 3
        assert _widgets_state(own_cluster) == set_at  # not even a no-op write
        said = _said(caplog, "converts through")
        assert [level for level, _ in said] == [logging.WARNING], said
        assert "Service team-a/a-ckptdrain-webhook" in said[0][1]
        assert "Service team-b/b-ckptdrain-webhook" in said[0][1]
        assert first.keep(ours) is CrdCa.IN_STEP

        # The CRD moved to another Service: that one is said once too.
        own_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                            input=json.dumps(_widgets("team-c", "c-ckptdrain-webhook")))
        assert [second.keep(theirs), second.keep(theirs)] == [CrdCa.NOT_OURS] * 2
        said = _said(caplog, "converts through")
        assert len(said) == 2 and "Service team-c/c-ckptdrain-webhook" in said[1][1], said
        # A replica reached by address owns no Service either.
        local = webhook_certs.CrdCaKeeper(WebhookAddress("127.0.0.1", 9443), logger,
                                          crd=WIDGETS)
        assert local.keep(theirs) is CrdCa.NOT_OURS
        assert _widgets_state(own_cluster)[0] == base64.b64encode(ours).decode()
    finally:
        own_cluster.kubectl("delete", "crd", WIDGETS, check=False)


def test_a_keeper_that_may_read_but_not_patch_says_which_right(
        own_cluster: Cluster, server: ConversionServer, namespace: str,
        certificates: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    own_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                        input=json.dumps(_widgets("team-a", "a-ckptdrain-webhook")))
    try:
        monkeypatch.setattr(webhook_certs, "_crds", _crds_as(own_cluster, _service_account(
            own_cluster, namespace, [{"apiGroups": ["apiextensions.k8s.io"],
                                      "resources": ["customresourcedefinitions"],
                                      "resourceNames": [WIDGETS], "verbs": ["get"]}])))
        caplog.set_level(logging.DEBUG, logger="ckptdrain.test.conversion")
        keeper = webhook_certs.CrdCaKeeper(
            WebhookAddress("a-ckptdrain-webhook.team-a.svc", 9443),
            logging.getLogger("ckptdrain.test.conversion"), crd=WIDGETS)
        wanted = certificates["ca"].read_bytes()
        # Until the role takes effect the read is refused too.
        wait_for(lambda: keeper.keep(wanted) is CrdCa.FORBIDDEN
                 and "may not patch" in _said(caplog, WIDGETS)[-1][1],
                 what="the read to be allowed and the patch refused")
        said = _said(caplog, WIDGETS)
        assert said and all(level == logging.WARNING for level, _ in said), said
        assert f"may not patch customresourcedefinitions {WIDGETS}" in said[-1][1]
        assert _widgets_state(own_cluster)[0] is None
    finally:
        own_cluster.kubectl("delete", "crd", WIDGETS, check=False)


def test_the_ca_bundle_keeper_leaves_what_it_cannot_set_alone(
        own_cluster: Cluster, server: ConversionServer, certificates: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A CRD that is not there yet (crds.install off, applied later) is
    missing, retried soon, reported once; one without a conversion webhook
    is not touched."""
    monkeypatch.setattr(webhook_certs, "_crds", _crds_as(own_cluster, None))
    caplog.set_level(logging.DEBUG, logger="ckptdrain.test.conversion")
    logger = logging.getLogger("ckptdrain.test.conversion")
    ours = certificates["ca"].read_bytes()
    here = WebhookAddress("127.0.0.1", server.port)
    absent = webhook_certs.CrdCaKeeper(here, logger, crd="absent.ckptdrain.io")
    assert [absent.keep(ours), absent.keep(ours)] == [CrdCa.MISSING] * 2
    said = _said(caplog, "absent.ckptdrain.io")
    assert [level for level, _ in said] == [logging.WARNING, logging.DEBUG], said
    assert webhook_certs.next_check_s(0, CrdCa.MISSING) == webhook_certs.MISSING_RETRY_S
    before = own_cluster.kubectl("get", "crd", "checkpoints.ckptdrain.io", "-o", "json").stdout
    assert webhook_certs.CrdCaKeeper(here, logger, crd="checkpoints.ckptdrain.io").keep(
        ours) is CrdCa.NO_WEBHOOK
    after = own_cluster.kubectl("get", "crd", "checkpoints.ckptdrain.io", "-o", "json").stdout
    assert json.loads(after)["metadata"]["resourceVersion"] == json.loads(before)[
        "metadata"]["resourceVersion"]
