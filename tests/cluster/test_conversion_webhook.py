"""The CheckpointPolicy CRD's conversion webhook through a real apiserver:
the apiserver sends its ConversionReviews to the admission process's /convert
(admission/process.py, the process each operator replica runs), reads of
v1beta1 fail while nothing answers there and v1alpha1 (stored) reads never
need it, and the operator keeps the CRD's conversion caBundle with only the
rights docs/rbac.md grants.

The CRD is crds/checkpointpolicies.yaml as shipped (v1beta1 served,
v1alpha1 stored). Its conversion clientConfig points at the process by URL
(no Service here). The
expected answers come from the pure converter (`convert`). Its own apiserver: this module
changes the CRD and stops the webhook, which would break other modules'
reads of the session's cluster."""

from __future__ import annotations

import base64
import copy
import json
import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_helpers import policy_crd_source, wait_for
from kubernetes import client, config
from operator_process import ALLOWED_ROOT, repo_root

from ckptdrain.contract.policy_versions import convert
from ckptdrain.operator.tls import webhook_certs
from ckptdrain.operator.tls.webhook_address import WebhookAddress
from ckptdrain.operator.tls.webhook_certs import CrdCa
from support import apiserver
from support.apiserver import Cluster, free_port
from support.conversion_server import ConversionServer, converting_to

ALPHA, BETA = "ckptdrain.io/v1alpha1", "ckptdrain.io/v1beta1"
CRD = "checkpointpolicies.ckptdrain.io"

def converted(obj: dict[str, Any], desired: str) -> dict[str, Any]:
    """What our converter makes of `obj` in `desired`."""
    return dict(convert(copy.deepcopy(obj), desired))


def policy_crd(url: str, ca_pem: bytes) -> dict[str, Any]:
    """crds/checkpointpolicies.yaml, converting through `url`."""
    return converting_to(policy_crd_source(), url, ca_pem)


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    apiserver.binaries_or_fail()
    with apiserver.running(tmp_path_factory.mktemp("conversion-apiserver")) as running:
        yield running


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("conversion-certs")
    ca = apiserver.make_ca(directory, "webhook-ca")
    cert, key = apiserver.make_cert(directory, "webhook", ca)
    other = apiserver.make_ca(directory, "other-ca")
    return {"ca": ca[0], "cert": cert, "key": key, "other_ca": other[0]}


@pytest.fixture(scope="module")
def server(own_cluster: Cluster, certificates: dict[str, Path]) -> Iterator[ConversionServer]:
    port = free_port()
    crd = policy_crd(f"https://127.0.0.1:{port}/convert", certificates["ca"].read_bytes())
    own_cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(crd))
    own_cluster.kubectl("apply", "--server-side", "-f",
                        str(repo_root() / "crds" / "checkpoints.yaml"))
    own_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    running = ConversionServer(own_cluster, certificates["cert"], certificates["key"], port)
    running.start()
    yield running
    running.stop()


@pytest.fixture
def namespace(own_cluster: Cluster, server: ConversionServer) -> Iterator[str]:
    name = f"conv-{time.monotonic_ns() % 10**8}"
    own_cluster.kubectl("create", "namespace", name)
    yield name
    # v1alpha1 named: a cleanup never depends on the webhook.
    own_cluster.kubectl("delete", "-n", name, resource(ALPHA), "--all", "--wait=false",
                        check=False)
    own_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def resource(version: str) -> str:
    """The CRD's resource at one version, as kubectl names it."""
    return f"checkpointpolicies.{version.partition('/')[2]}.ckptdrain.io"


def read(cluster: Cluster, namespace: str, version: str, name: str,
         check: bool = True) -> Any:
    got = cluster.kubectl("get", "-n", namespace, resource(version), name, "-o", "json",
                          check=check)
    return json.loads(got.stdout) if check else got


def alpha_policy(name: str) -> dict[str, Any]:
    """A v1alpha1 policy with the spellings v1beta1 writes otherwise."""
    return {"apiVersion": ALPHA, "kind": "CheckpointPolicy", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "model": {"parameters": "405B", "bytesPerParameter": 12.5},
                     "interval": "1d", "overlap": "0.1",
                     "localTier": {"path": f"{ALLOWED_ROOT}/nvme", "keep": 2,
                                   "capacity": "1.5TiB"},
                     "caps": {"bandwidth": "10GB/s"},
                     "storage": {"uri": "s3://ckpt-bucket/runs",
                                 "endpoint": "http://minio.storage:9000",
                                 "credentialsSecretRef": {"name": "s3-creds"}}}}


def same_object(answer: dict[str, Any], expected: dict[str, Any]) -> None:
    """The apiserver's answer is our converter's: version, spec, status, and
    the object it is (the apiserver refuses a conversion that changes
    metadata)."""
    assert answer["apiVersion"] == expected["apiVersion"]
    assert answer["spec"] == expected["spec"]
    assert answer.get("status") == expected.get("status")
    for key in ("name", "namespace", "uid", "resourceVersion", "generation"):
        assert answer["metadata"][key] == expected["metadata"][key], key


def test_the_apiserver_converts_through_our_convert(
        own_cluster: Cluster, server: ConversionServer, namespace: str) -> None:
    made = own_cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "json",
                               input=json.dumps(alpha_policy("llama")))
    assert json.loads(made.stdout)["spec"]["interval"] == "1d"  # stored as written
    own_cluster.kubectl("patch", "-n", namespace, resource(ALPHA), "llama",
                        "--subresource=status", "--type=merge", "-p", json.dumps(
                            {"status": {"lastRestoreAgreement": {"round": 1, "pods": 2,
                                                                 "startedAt": 1764464523.5},
                                        "goodput": {"heldSince": 1764460000,
                                                    "endedAt": None}}}))
    stored = read(own_cluster, namespace, ALPHA, "llama")
    assert stored["apiVersion"] == ALPHA

    before = server.settled()
    beta = read(own_cluster, namespace, BETA, "llama")
    same_object(beta, converted(stored, BETA))
    wait_for(lambda: server.conversions() > before, timeout_s=10,
             what="the process to report the ConversionReview the apiserver sent it")
    # The spellings v1beta1 has.
    assert (beta["spec"]["interval"], beta["spec"]["overlap"]) == ("24h", "10%")

    # A list without a version is served in the preferred one, v1beta1.
    listed = json.loads(own_cluster.kubectl("get", "-n", namespace, "checkpointpolicies",
                                            "-o", "json").stdout)["items"]
    assert [i["apiVersion"] for i in listed] == [BETA]
    same_object(listed[0], beta)


def test_a_v1beta1_write_is_stored_as_our_converter_makes_it(
        own_cluster: Cluster, server: ConversionServer, namespace: str) -> None:
    """The other way: the apiserver stores v1alpha1, so a v1beta1 create is
    converted by /convert before it reaches etcd."""
    first = converted(alpha_policy("gpt"), BETA)
    first.pop("status", None)
    made = json.loads(own_cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "json",
                                          input=json.dumps(first)).stdout)
    assert made["apiVersion"] == BETA
    stored = read(own_cluster, namespace, ALPHA, "gpt")
    same_object(stored, {**converted(made, ALPHA), "metadata": stored["metadata"]})
    assert stored["metadata"]["uid"] == made["metadata"]["uid"]
    # v1beta1 → v1alpha1 → v1beta1 gives back what was written.
    assert read(own_cluster, namespace, BETA, "gpt")["spec"] == made["spec"]


def uninstall_block() -> str:
    """The shell block of docs/install.md's "Versions and the conversion webhook"."""
    text = (repo_root() / "docs" / "install.md").read_text()
    after = text[text.index("### Versions and the conversion webhook"):]
    block = re.findall(r"```sh\n(.*?)```", after, re.S)[0]
    assert "checkpointpolicies.v1alpha1.ckptdrain.io" in block
    return str(block)


def kubectl_dir(cluster: Cluster) -> str:
    return str(cluster.binaries.kubectl.parent)


def test_without_the_webhook_v1beta1_reads_fail_and_v1alpha1_reads_work(
        own_cluster: Cluster, server: ConversionServer, namespace: str) -> None:
    own_cluster.kubectl("create", "-n", namespace, "-f", "-",
                        input=json.dumps(alpha_policy("down")))
    server.stop()
    try:
        failed = read(own_cluster, namespace, BETA, "down", check=False)
        assert failed.returncode != 0
        assert "conversion" in failed.stderr.lower(), failed.stderr
        listed = own_cluster.kubectl("get", "-n", namespace, "checkpointpolicies", check=False)
        assert listed.returncode != 0 and "conversion" in listed.stderr.lower()
        # What the operator and every v1alpha1 client read: never converted.
        assert read(own_cluster, namespace, ALPHA, "down")["spec"]["interval"] == "1d"
        # The clean-up docs/install.md gives, as written, works with no
        # replica answering.
        ran = subprocess.run(["bash", "-euo", "pipefail", "-c", uninstall_block()],
                             env={**own_cluster.env(), "PATH": f"{kubectl_dir(own_cluster)}:"
                                  f"{os.environ['PATH']}"},
                             capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr
        gone = own_cluster.kubectl("get", "-n", namespace, resource(ALPHA), "down",
                                   "--ignore-not-found", "-o", "name")
        assert gone.stdout.strip() == ""
    finally:
        server.start()
    wait_for(lambda: own_cluster.kubectl("get", "-n", namespace, "checkpointpolicies",
                                         check=False).returncode == 0,
             what="v1beta1 reads once the webhook answers again")


def _documented_crd_rule() -> dict[str, Any]:
    """The operator's rule on CRDs by name, as docs/rbac.md grants it."""
    text = (repo_root() / "docs" / "rbac.md").read_text()
    rules = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", text, re.S)[0])["rules"]
    (rule,) = [r for r in rules if "customresourcedefinitions" in r["resources"]
               and r.get("resourceNames")]
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
    (a GitOps sync, `helm upgrade --force`) breaks v1beta1 reads until the
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
    wait_for(lambda: read(own_cluster, namespace, BETA, "ca", check=False).returncode != 0,
             what="v1beta1 reads to fail with a CA that did not sign the webhook's certificate")

    assert keeper.keep(ours) is CrdCa.SET
    assert _ca_bundle(own_cluster) == base64.b64encode(ours).decode()
    assert keeper.keep(ours) is CrdCa.IN_STEP
    wait_for(lambda: read(own_cluster, namespace, BETA, "ca", check=False).returncode == 0,
             what="v1beta1 reads with the operator's CA back")
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
    assert "v1beta1 fail" in said[0][1]
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
