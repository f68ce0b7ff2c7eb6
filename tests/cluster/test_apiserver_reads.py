"""The admission process's own apiserver client (apiserver/connection.py,
apiserver/reads.py) against the real apiserver: as a pod's service account
(its token file replaced while it runs, as the kubelet does), as a
kubeconfig user with a client certificate or skipping verification, and
through a watch."""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from ckptdrain.operator.apiserver import connection as apiserver_connection
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.apiserver.reads import ApiError
from support import apiserver


def _pods(connection: Any, namespace: str) -> int:
    response = connection.request(f"/api/v1/namespaces/{namespace}/pods", [], 10, True)
    apiserver_reads._raise_for(response)
    return len(json.loads(response.data)["items"])


def _service_account(cluster: apiserver.Cluster, namespace: str) -> str:
    """A service account that may list pods in `namespace`; its token."""
    cluster.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    cluster.kubectl("create", "role", "pods", "--verb=list", "--resource=pods", "-n", namespace)
    cluster.kubectl("create", "rolebinding", "pods", "--role=pods",
                    f"--serviceaccount={namespace}:reader", "-n", namespace)
    return cluster.kubectl("create", "token", "reader", "-n", namespace,
                           "--duration=1h").stdout.strip()


def test_in_a_pod_the_token_is_read_again_when_the_kubelet_replaces_it(
        cluster: apiserver.Cluster, namespace: str, tmp_path: Path) -> None:
    token = _service_account(cluster, namespace)
    mounted = tmp_path / "serviceaccount"
    mounted.mkdir()
    shutil.copy(cluster.ca_file, mounted / "ca.crt")
    (mounted / "token").write_text("expired-or-wrong")
    host, port = cluster.server.removeprefix("https://").rsplit(":", 1)
    connection = apiserver_connection.in_cluster(
        {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}, mounted)
    assert connection is not None
    with pytest.raises(ApiError) as refused:
        _pods(connection, namespace)
    assert refused.value.status == 401
    assert "expired-or-wrong" not in str(refused.value)
    # The kubelet's refresh: a new file in place of the old, no restart.
    fresh = mounted / "token.new"
    fresh.write_text(token)
    os.replace(fresh, mounted / "token")
    assert _pods(connection, namespace) == 0
    # Authenticated as the service account, not as anyone else: it may not
    # list pods of another namespace.
    with pytest.raises(ApiError, match=f"system:serviceaccount:{namespace}:reader") as denied:
        _pods(connection, "default")
    assert denied.value.status == 403


def test_a_kubeconfig_user_with_a_client_certificate_leaves_no_key_on_disk(
        cluster: apiserver.Cluster, namespace: str, tmp_path: Path) -> None:
    crt, key = apiserver.make_cert(tmp_path, "tester", (cluster.ca_file, cluster.ca_key),
                                   subject="/O=system:masters/CN=tester")
    config = tmp_path / "config"
    config.write_text(json.dumps({
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {
            "server": cluster.server,
            "certificate-authority-data": base64.b64encode(
                cluster.ca_file.read_bytes()).decode()}}],
        "users": [{"name": "u", "user": {
            "client-certificate-data": base64.b64encode(crt.read_bytes()).decode(),
            "client-key-data": base64.b64encode(key.read_bytes()).decode()}}]}))
    before = set(Path(tempfile.gettempdir()).glob("ckptdrain-client-*"))
    connection = apiserver_connection.from_kubeconfig(config)
    assert set(Path(tempfile.gettempdir()).glob("ckptdrain-client-*")) == before
    assert connection.token is None  # the certificate alone
    assert _pods(connection, namespace) == 0


def test_a_watch_brings_what_is_created_after_its_list(
        cluster: apiserver.Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    apiserver_reads.connection.cache_clear()
    try:
        path = f"/api/v1/namespaces/{namespace}/configmaps"
        listed = apiserver_reads.get_json(path, [], 10)
        response = apiserver_reads.stream(path, [
            ("watch", "true"), ("resourceVersion", listed["metadata"]["resourceVersion"]),
            ("timeoutSeconds", "20")], (5, 30))
        seen: list[dict[str, Any]] = []

        def read() -> None:
            for event in apiserver_reads.watch_events(response):
                seen.append(event)
                break
        reader = threading.Thread(target=read)
        reader.start()
        cluster.kubectl("create", "configmap", "after", "-n", namespace)
        reader.join(30)
        response.close()
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in seen] == [
            ("ADDED", "after")]
        with pytest.raises(ApiError, match="not found") as missing:
            apiserver_reads.get_json(f"{path}/absent", [], 10)
        assert missing.value.status == 404
    finally:
        apiserver_reads.connection.cache_clear()


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_a_kubeconfig_that_skips_verification_still_reads(
        cluster: apiserver.Cluster, namespace: str, tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(json.dumps({
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": cluster.server,
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": cluster.token}}]}))
    assert _pods(apiserver_connection.from_kubeconfig(config), namespace) == 0
    # Without it, the apiserver's certificate (its own CA) is refused.
    strict = json.loads(config.read_text())
    strict["clusters"][0]["cluster"].pop("insecure-skip-tls-verify")
    config.write_text(json.dumps(strict))
    with pytest.raises(apiserver_reads.HTTPError, match="CERTIFICATE_VERIFY_FAILED"):
        _pods(apiserver_connection.from_kubeconfig(config), namespace)
