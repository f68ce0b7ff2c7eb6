"""The node side's SDK-free apiserver client: when it applies, what it asks
for, and what its errors say (kube_rest.py). Its requests against a real
apiserver are in tests/cluster/test_kube_rest.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ckptdrain import kube_rest, kubeclient
from ckptdrain.kube_rest import ApiError, InCluster


@pytest.fixture
def mounted(tmp_path: Path) -> tuple[str, str]:
    """A token and the CA a kubelet would mount (a CA that loads)."""
    token = tmp_path / "token"
    token.write_text("t0k3n\n")
    ca = tmp_path / "ca.crt"
    ca.write_text(_a_ca())
    return str(token), str(ca)


def _a_ca() -> str:
    """Any PEM certificate the ssl module can load as a CA."""
    import certifi

    text = Path(certifi.where()).read_text()
    end = "-----END CERTIFICATE-----"
    return text[text.index("-----BEGIN CERTIFICATE-----"):text.index(end) + len(end)] + "\n"


def test_in_a_pod_it_takes_the_service_host_and_port(mounted: tuple[str, str]) -> None:
    token, ca = mounted
    found = InCluster.from_env({"KUBERNETES_SERVICE_HOST": "10.96.0.1",
                                "KUBERNETES_SERVICE_PORT": "443"}, token, ca)
    assert found is not None and (found.host, found.port) == ("10.96.0.1", 443)


@pytest.mark.parametrize("env", [
    {},
    {"KUBERNETES_SERVICE_HOST": "10.96.0.1"},
    {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "https"},
    {"KUBERNETES_SERVICE_PORT": "443"},
])
def test_without_the_service_it_is_not_in_a_pod(mounted: tuple[str, str],
                                                env: dict[str, str]) -> None:
    token, ca = mounted
    assert InCluster.from_env(env, token, ca) is None


def test_without_a_mounted_token_or_ca_it_is_not_in_a_pod(mounted: tuple[str, str],
                                                          tmp_path: Path) -> None:
    token, ca = mounted
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert InCluster.from_env(env, str(tmp_path / "none"), ca) is None
    assert InCluster.from_env(env, token, str(tmp_path / "none")) is None


def test_paths_name_the_group_and_quote_every_segment() -> None:
    assert kube_rest._path("", "v1", "team-a", "pods", "llama-0") == \
        "/api/v1/namespaces/team-a/pods/llama-0"
    assert kube_rest._path("coordination.k8s.io", "v1", "team-a", "leases") == \
        "/apis/coordination.k8s.io/v1/namespaces/team-a/leases"
    assert kube_rest._path("", "v1", "a/b", "pods", "x?y") == \
        "/api/v1/namespaces/a%2Fb/pods/x%3Fy"


def test_an_error_says_the_apiservers_own_sentence() -> None:
    status = b'{"kind":"Status","message":"leases \\"x\\" is forbidden: no","code":403}'
    assert kube_rest._message(status) == 'leases "x" is forbidden: no'
    assert kube_rest._message(b"<html>bad gateway</html>") == "<html>bad gateway</html>"
    assert len(kube_rest._message(b"x" * 5000)) == kube_rest.ERROR_TEXT
    err = ApiError(404, "Not Found", "pods \"p\" not found")
    assert (err.status, err.reason) == (404, "Not Found") and "not found" in str(err)


def test_its_errors_have_a_status_and_others_none() -> None:
    assert kubeclient.api_status(ApiError(409, "Conflict", "")) == 409
    assert kubeclient.api_status(OSError("refused")) is None


def test_asking_an_errors_status_does_not_load_the_sdk() -> None:
    """Restore's path: a failed request's status is read without the
    kubernetes package, which costs more to load than the request."""
    code = ("import sys; from ckptdrain import kubeclient; "
            "assert kubeclient.api_status(ValueError()) is None; "
            "from ckptdrain.restore import command, meeting; from ckptdrain.node import kube; "
            "print('kubernetes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_node_side_factories_fall_back_to_the_sdk_outside_a_pod(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    sdk = object()
    monkeypatch.setattr(kubeclient, "core_api", lambda: sdk)
    monkeypatch.setattr(kubeclient, "custom_objects_api", lambda: sdk)
    assert kubeclient.node_core_api() is sdk
    assert kubeclient.node_custom_objects_api() is sdk


def test_node_side_factories_in_a_pod_use_the_mounted_token(
        mounted: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    token, ca = mounted
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(kube_rest, "TOKEN_PATH", token)
    monkeypatch.setattr(kube_rest, "CA_PATH", ca)
    assert isinstance(kubeclient.node_core_api(), kube_rest.CoreV1)
    assert isinstance(kubeclient.node_custom_objects_api(), kube_rest.CustomObjects)


@pytest.mark.parametrize(("proxy", "no_proxy", "direct"), [
    ("", "", True),
    ("http://proxy:3128", "", False),
    ("http://proxy:3128", "10.96.0.1", True),
    ("http://proxy:3128", "10.96.0.0/12,.svc", True),
    ("http://proxy:3128", "*", True),
    ("http://proxy:3128", "10.0.0.0/16,example.com", False),
])
def test_behind_a_proxy_it_leaves_the_apiserver_to_the_sdk(
        mounted: tuple[str, str], proxy: str, no_proxy: str, direct: bool) -> None:
    """The SDK reaches the apiserver through HTTPS_PROXY unless NO_PROXY
    covers it; this client goes only where the SDK would have gone direct."""
    token, ca = mounted
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
           "https_proxy": proxy, "NO_PROXY": no_proxy}
    assert (InCluster.from_env(env, token, ca) is not None) is direct


def test_a_ca_that_does_not_load_leaves_it_to_the_sdk(tmp_path: Path,
                                                     mounted: tuple[str, str]) -> None:
    token, _ = mounted
    bad = tmp_path / "bad.crt"
    bad.write_text("not a certificate\n")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert InCluster.from_env(env, token, str(bad)) is None
