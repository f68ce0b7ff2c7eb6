"""The node side's SDK-free client against a real apiserver, as a pod's
restore uses it: the pod's ServiceAccount token (bound to the pod, with the
agent's documented rights) and the cluster CA in files, the apiserver named
by KUBERNETES_SERVICE_HOST and _PORT (kube_rest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from documented_rbac import agent_rules
from test_rbac import _bind

from ckptdrain import kube_rest
from ckptdrain.contract.api import ANNOTATION_RESTORE_RESULT
from ckptdrain.kube_rest import ApiError, CustomObjects, InCluster
from ckptdrain.node.kube import annotate_own_pod_with
from ckptdrain.node.lease import LEASE_API, LEASE_PLURAL
from ckptdrain.restore.meeting import Meeting, NoRights
from support.apiserver import Cluster

AGENT = "ckptdrain-agent"
POD = "trainer-0"


class Mounted:
    """What the kubelet gives a pod's containers: token and CA files, the
    service's host and port in the environment."""

    def __init__(self, cluster: Cluster, namespace: str, tmp: Path) -> None:
        self.cluster, self.namespace = cluster, namespace
        address = urlsplit(cluster.server)
        self.env = {"KUBERNETES_SERVICE_HOST": str(address.hostname),
                    "KUBERNETES_SERVICE_PORT": str(address.port)}
        self.token, self.ca = tmp / "token", tmp / "ca.crt"
        self.ca.write_bytes(Path(cluster.ca_file).read_bytes())
        self.pod_uid = self._pod()
        self.rotate()

    def _pod(self) -> str:
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": POD, "namespace": self.namespace},
               "spec": {"serviceAccountName": AGENT,
                        "containers": [{"name": "trainer", "image": "trainer:1"}]}}
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
        return self.cluster.kubectl("get", "pod", POD, "-n", self.namespace,
                                    "-o", "jsonpath={.metadata.uid}").stdout

    def rotate(self) -> None:
        """A new token bound to the pod, written in place as the kubelet does."""
        token = self.cluster.kubectl(
            "create", "token", AGENT, "-n", self.namespace, "--duration=1h",
            "--bound-object-kind=Pod", f"--bound-object-name={POD}",
            f"--bound-object-uid={self.pod_uid}").stdout.strip()
        self.token.write_text(token)

    def client(self) -> InCluster:
        found = InCluster.from_env(self.env, str(self.token), str(self.ca))
        assert found is not None
        return found

    def annotations(self) -> dict[str, str]:
        out = self.cluster.kubectl("get", "pod", POD, "-n", self.namespace, "-o", "json")
        return dict(json.loads(out.stdout)["metadata"].get("annotations") or {})


@pytest.fixture
def mounted(cluster: Cluster, namespace: str, tmp_path: Path) -> Mounted:
    _bind(cluster, "Role", AGENT, namespace, agent_rules())
    return Mounted(cluster, namespace, tmp_path)


def test_it_annotates_its_own_pod(mounted: Mounted) -> None:
    api = kube_rest.CoreV1(mounted.client())
    assert annotate_own_pod_with(mounted.namespace, POD, {"ckptdrain.io/restored-from": "fresh"},
                                 api)
    assert mounted.annotations()["ckptdrain.io/restored-from"] == "fresh"
    # A second patch merges with the first, over the same kept connection.
    assert annotate_own_pod_with(mounted.namespace, POD, {"example.com/x": "1"}, api)
    assert {"ckptdrain.io/restored-from", "example.com/x"} <= set(mounted.annotations())


def test_its_errors_carry_the_apiservers_status_and_sentence(mounted: Mounted,
                                                             cluster: Cluster) -> None:
    api = kube_rest.CoreV1(mounted.client())
    with pytest.raises(ApiError) as missing:
        api.patch_namespaced_pod("no-such-pod", mounted.namespace,
                                 {"metadata": {"annotations": {"a": "b"}}})
    assert missing.value.status == 404 and "not found" in missing.value.message
    cluster.kubectl("create", "namespace", "kube-rest-other", check=False)
    with pytest.raises(ApiError) as forbidden:
        api.patch_namespaced_pod(POD, "kube-rest-other", {"metadata": {"annotations": {}}})
    assert forbidden.value.status == 403 and "forbidden" in forbidden.value.message
    assert not annotate_own_pod_with("kube-rest-other", POD, {"a": "b"}, api)


def test_a_rotated_token_is_read_for_the_next_request(mounted: Mounted) -> None:
    api = kube_rest.CoreV1(mounted.client())
    body = {"metadata": {"annotations": {"example.com/n": "1"}}}
    api.patch_namespaced_pod(POD, mounted.namespace, body)
    mounted.token.write_text("not-a-token")
    with pytest.raises(ApiError) as refused:
        api.patch_namespaced_pod(POD, mounted.namespace, body)
    assert refused.value.status == 401
    mounted.rotate()
    api.patch_namespaced_pod(POD, mounted.namespace, body)


class Relay:
    """A TCP relay in front of the apiserver that can drop every connection
    it carries, as an apiserver (or a load balancer) closing idle ones."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            far = socket.create_connection(self.target)
            self.open += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def drop(self) -> None:
        for s in self.open:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self.open.clear()

    def close(self) -> None:
        self.drop()
        self.listener.close()


def test_a_kept_connection_the_server_dropped_is_replaced(mounted: Mounted) -> None:
    relay = Relay(mounted.env["KUBERNETES_SERVICE_HOST"],
                  int(mounted.env["KUBERNETES_SERVICE_PORT"]))
    try:
        client = InCluster.from_env({**mounted.env, "KUBERNETES_SERVICE_PORT": str(relay.port)},
                                    str(mounted.token), str(mounted.ca))
        assert client is not None
        api = kube_rest.CoreV1(client)
        api.patch_namespaced_pod(POD, mounted.namespace,
                                 {"metadata": {"annotations": {"a": "1"}}})
        kept = client._conn
        relay.drop()
        time.sleep(0.2)
        api.patch_namespaced_pod(POD, mounted.namespace,
                                 {"metadata": {"annotations": {"a": "2"}}})
        assert client._conn is not kept  # a new connection carried the second
        assert mounted.annotations()["a"] == "2"
    finally:
        relay.close()


def test_a_ca_the_server_does_not_chain_to_is_refused(mounted: Mounted, tmp_path: Path) -> None:
    import certifi

    other = tmp_path / "other-ca.crt"
    other.write_text(Path(certifi.where()).read_text())
    client = InCluster.from_env(mounted.env, str(mounted.token), str(other))
    assert client is not None
    with pytest.raises(OSError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        kube_rest.CoreV1(client).patch_namespaced_pod(
            POD, mounted.namespace, {"metadata": {"annotations": {"a": "b"}}})


def test_the_meeting_reports_decides_and_lists_through_it(mounted: Mounted) -> None:
    """Two ranks' reports and one decision, on Leases, as restore writes them."""
    from ckptdrain.restore.agreement import Report

    api = CustomObjects(mounted.client())
    meeting = Meeting(mounted.namespace, f"{mounted.namespace}/llama", api)
    threads = []
    for rank in (0, 1):
        report = Report(round=1, rank=rank, uid=f"uid-{rank}", node=f"node-{rank}",
                        local={100: "t1"}, complete=(50,))
        threads.append(threading.Thread(target=meeting.report, args=(report,)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(meeting.reports()) == [0, 1]
    again = Report(round=2, rank=0, uid="uid-0", node="node-0", complete=(50,))
    meeting.report(again)  # replaces its own, by resourceVersion
    own = meeting.own_report(0)
    assert own is not None and own.round == 2
    assert meeting.state() == (None, None, None)
    leases = api.list_namespaced_custom_object(*LEASE_API, mounted.namespace, LEASE_PLURAL)
    assert len(leases["items"]) == 2


def test_a_meeting_without_rights_on_leases_is_told_so(mounted: Mounted,
                                                      cluster: Cluster) -> None:
    cluster.kubectl("create", "namespace", "kube-rest-other", check=False)
    meeting = Meeting("kube-rest-other", "kube-rest-other/llama",
                      CustomObjects(mounted.client()))
    with pytest.raises(NoRights, match="no rights on leases in kube-rest-other"):
        meeting.state()


def test_restore_in_a_pod_annotates_it_without_loading_the_sdk(mounted: Mounted,
                                                               tmp_path: Path) -> None:
    """The init container's whole run: an empty store is a fresh start, and
    the result reaches the pod; the kubernetes package is never imported."""
    (tmp_path / "store").mkdir()
    env: dict[str, Any] = {k: v for k, v in os.environ.items()
                           if not k.startswith(("CKPTDRAIN_", "AWS_", "KUBE"))}
    env.update(mounted.env, CKPTDRAIN_WORK_DIR=str(tmp_path / "work"),
               CKPTDRAIN_LOCAL_DIR=str(tmp_path / "local"),
               CKPTDRAIN_STORE_URI=f"file://{tmp_path}/store",
               CKPTDRAIN_POLICY=f"{mounted.namespace}/llama", CKPTDRAIN_POD_NAME=POD,
               CKPTDRAIN_POD_UID=mounted.pod_uid, CKPTDRAIN_NAMESPACE=mounted.namespace)
    code = ("import sys; from ckptdrain import kube_rest, cli; "
            f"kube_rest.TOKEN_PATH = {str(mounted.token)!r}; "
            f"kube_rest.CA_PATH = {str(mounted.ca)!r}; "
            "rc = cli.main(['restore']); "
            "print('sdk loaded:', 'kubernetes' in sys.modules); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sdk loaded: False" in done.stdout, done.stdout + done.stderr
    result = json.loads(mounted.annotations()[ANNOTATION_RESTORE_RESULT])
    assert result["outcome"] == "fresh_start"
