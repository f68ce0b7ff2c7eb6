"""The apiserver side of webhook.clientCA (docs/install.md, "Locking down the
webhook"): a real kube-apiserver started with the page's
AdmissionConfiguration and kubeconfig presents the client certificate to
the webhook the kubeconfig names, and the admission server, which requires
one, answers it; a webhook the kubeconfig does not name gets no
certificate, so the server refuses it and the apiserver fails the request
closed. The admission server runs in this process (the unit tests, in
tests/unit/opcore/test_op_webhook_client_cert.py, cover its refusals)."""

from __future__ import annotations

import asyncio
import base64
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_process import repo_root

from ckptdrain.operator import config
from ckptdrain.operator.admission import certificates as admission_certificates
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission import server as admission_server
from ckptdrain.operator.admission.policy_mirror import PolicyMirror
from support import apiserver

INSTALL = repo_root() / "docs" / "install.md"


def _documented(note: str) -> dict[str, Any]:
    """The YAML block of docs/install.md under the marker `fragment <note> ...`."""
    text = INSTALL.read_text()
    found = re.search(r"<!-- docs-test: fragment " + re.escape(note) +
                      r"[^>]*-->\n```yaml\n(.*?)\n```", text, re.S)
    assert found, f"{INSTALL}: no block marked 'fragment {note}'"
    return dict(yaml.safe_load(found.group(1)))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The admission server on 127.0.0.1, requiring a client certificate."""
    server_ca = apiserver.make_ca(tmp_path, "serving-ca")
    cert, key = apiserver.make_cert(tmp_path, "webhook", server_ca)  # 127.0.0.1, localhost
    client_ca = apiserver.make_ca(tmp_path, "client-ca")
    client = apiserver.make_cert(tmp_path, "apiserver-client", client_ca, sans=("DNS:apiserver",))
    reports: list[tuple[str, str]] = []
    cfg = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
    reviewer = admission_process.Reviewer(cfg, PolicyMirror(),
                                          lambda w, o, s: reports.append((w, o)))
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    server = admission_server.Server(
        ("127.0.0.1", 0),
        admission_certificates.Certificates(str(cert), str(key), str(client_ca[0])),
        reviewer, loop)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield {"port": server.server_address[1], "server_ca": server_ca[0], "client": client,
               "reports": reports}
    finally:
        server.shutdown()
        server.server_close()
        loop.call_soon_threadsafe(loop.stop)


def _apiserver_files(directory: Path, port: int, client: tuple[Path, Path]) -> Path:
    """The page's two files, with this test's paths, and the user named for
    the webhook's URL (host:port) as the page names it for the Service."""
    kubeconfig = _documented("apiserver kubeconfig")
    (user,) = kubeconfig["users"]
    assert user["name"] == "ckptdrain-webhook.ckptdrain.svc"  # the chart's Service, port 443
    user["name"] = f"127.0.0.1:{port}"
    user["user"] = {"client-certificate": str(client[0]), "client-key": str(client[1])}
    kubeconfig_file = directory / "webhook-clients.kubeconfig"
    kubeconfig_file.write_text(yaml.safe_dump(kubeconfig))
    admission_config = _documented("apiserver admission configuration")
    names = {p["name"] for p in admission_config["plugins"]}
    assert names == {"ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"}
    for plugin in admission_config["plugins"]:
        plugin["configuration"]["kubeConfigFile"] = str(kubeconfig_file)
    path = directory / "admission.yaml"
    path.write_text(yaml.safe_dump(admission_config))
    return path


def _webhook(host: str, port: int, server_ca: Path) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "ckptdrain-client-cert-test"},
            "webhooks": [{
                "name": "client-cert.ckptdrain.io",
                "clientConfig": {"url": f"https://{host}:{port}/{admission.VALIDATE_ID}",
                                 "caBundle": base64.b64encode(server_ca.read_bytes()).decode()},
                "rules": [{"operations": ["DELETE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["configmaps"]}],
                "objectSelector": {"matchLabels": {"ckptdrain.io/client-cert-test": "true"}},
                "failurePolicy": "Fail", "sideEffects": "None",
                "admissionReviewVersions": ["v1"], "timeoutSeconds": 5}]}


def _deletion(cluster: apiserver.Cluster, name: str) -> Any:
    cluster.kubectl("create", "configmap", name, "-n", "default")
    cluster.kubectl("label", "configmap", name, "-n", "default",
                    "ckptdrain.io/client-cert-test=true")
    return cluster.kubectl("delete", "configmap", name, "-n", "default", check=False)


def test_the_documented_configuration_makes_the_apiserver_present_its_certificate(
        served: dict[str, Any], tmp_path: Path) -> None:
    apiserver.binaries_or_fail()
    admission_config = _apiserver_files(tmp_path, served["port"], served["client"])
    with apiserver.running(tmp_path / "apiserver", extra_args=[
            f"--admission-control-config-file={admission_config}"]) as cluster:
        # A host the kubeconfig does not name: no certificate presented, no
        # review answered, and the apiserver fails the deletion closed.
        hook = tmp_path / "hook.yaml"
        hook.write_text(yaml.safe_dump(_webhook("localhost", served["port"],
                                                served["server_ca"])))
        cluster.kubectl("apply", "-f", str(hook))
        refused = _deletion(cluster, "unnamed-host")
        assert refused.returncode != 0, refused.stdout
        assert 'failed calling webhook "client-cert.ckptdrain.io"' in refused.stderr
        assert "a client certificate signed by CKPTDRAIN_WEBHOOK_CLIENT_CA" in refused.stderr
        assert served["reports"] == []
        # The host the kubeconfig names: its certificate, and the answer.
        hook.write_text(yaml.safe_dump(_webhook("127.0.0.1", served["port"],
                                                served["server_ca"])))
        cluster.kubectl("apply", "-f", str(hook))
        allowed = _deletion(cluster, "named-host")
        assert allowed.returncode == 0, allowed.stderr
        assert served["reports"] == [("policy", "ok")]
