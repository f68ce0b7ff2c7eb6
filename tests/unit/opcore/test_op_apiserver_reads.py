"""The admission process's own apiserver client (apiserver/connection.py,
apiserver/reads.py) without a server: its kubeconfig reading, its rotating
token file, its proxy rule, its watch lines and its errors; and that the
admission process never loads the `kubernetes` package. Against a real
apiserver: tests/cluster/test_apiserver_reads.py."""

from __future__ import annotations

import http.server
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from ckptdrain.operator.admission import policy_mirror
from ckptdrain.operator.apiserver import connection as apiserver_connection
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.apiserver.connection import (
    ApiError,
    ReadFailed,
    TokenFile,
    UnsupportedCredentials,
)
from ckptdrain.operator.policy import version_messages


def test_the_admission_process_never_loads_the_kubernetes_package() -> None:
    # What it imports to serve, with the reads and both views; importing the
    # SDK would cost about 20 MiB of its resident memory (docs/scale.md).
    code = ("import sys\n"
            "import ckptdrain.operator.admission.process\n"
            "from ckptdrain.operator.admission import holder_mirror, policy_mirror\n"
            "from ckptdrain.operator.apiserver import reads\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('kubernetes', 'kopf', 'pydantic', 'requests', 'yaml')))\n")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True)
    assert found.stdout.strip() == "[]"


def test_watch_lines_are_split_across_chunks() -> None:
    class Response:
        def stream(self, amt: int) -> Any:
            return iter([b'{"a"', b': 1}\n{"b": 2}\n', b"\n", b'{"c": 3}'])

    assert list(apiserver_reads.watch_events(Response())) == [{"a": 1}, {"b": 2}, {"c": 3}]


def test_a_token_file_is_read_again_when_the_kubelet_replaces_it(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    read = TokenFile(token)
    assert read() == "first"
    # The kubelet writes a new directory and swaps a symlink: another file.
    fresh = tmp_path / "fresh"
    fresh.write_text("second")
    os.replace(fresh, token)
    assert read() == "second"
    assert read() == "second"


def _kubeconfig(path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None
                ) -> Path:
    path.write_text(json.dumps({
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": cluster or {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": user}]}))
    return path


@pytest.mark.parametrize("field", ["exec", "auth-provider", "username"])
def test_a_user_only_the_sdk_can_act_as_is_named(tmp_path: Path, field: str) -> None:
    config = _kubeconfig(tmp_path / "config", {field: {"command": "aws"}})
    with pytest.raises(UnsupportedCredentials, match=f"user 'u' has '{field}'"):
        apiserver_connection.from_kubeconfig(config)


def test_a_missing_context_or_server_names_what_is_missing(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(json.dumps({"current-context": "gone", "contexts": []}))
    with pytest.raises(ValueError, match="no entry named 'gone' in contexts"):
        apiserver_connection.from_kubeconfig(config)
    _kubeconfig(config, {"token": "t"}, {"insecure-skip-tls-verify": True})
    with pytest.raises(ValueError, match="cluster 'k' has no server"):
        apiserver_connection.from_kubeconfig(config)


def test_a_token_file_of_the_kubeconfig_is_relative_to_it(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file")
    found = apiserver_connection.from_kubeconfig(_kubeconfig(tmp_path / "config",
                                                        {"tokenFile": "token"}))
    assert found.token() == "from-file"
    assert found.server == "https://127.0.0.1:1"


def test_outside_a_pod_there_is_no_in_cluster_connection(tmp_path: Path) -> None:
    assert apiserver_connection.in_cluster({}, tmp_path) is None
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert apiserver_connection.in_cluster(env, tmp_path) is None  # no token mounted


def test_an_error_keeps_the_apiserver_message() -> None:
    class Response:
        status, reason = 403, "Forbidden"
        data = json.dumps({"kind": "Status", "message": 'pods is forbidden: User "x" '
                           'cannot list resource "pods"'}).encode()

    with pytest.raises(ApiError) as raised:
        apiserver_reads._raise_for(Response())
    assert raised.value.status == 403
    assert str(raised.value) == ('(403) Forbidden: pods is forbidden: User "x" cannot list '
                                 'resource "pods"')


def test_a_token_file_mid_swap_keeps_the_last_good_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    never = TokenFile(token)
    with pytest.raises(ReadFailed, match="cannot read the token file"):
        never()  # nothing good yet: a failed read, not a crash
    token.write_text("good")
    read = TokenFile(token)
    assert read() == "good"
    token.unlink()  # the kubelet between removing the old and linking the new
    assert read() == "good"
    token.write_bytes(b"\xff\xfe not text")
    assert read() == "good"  # nor a half-written one
    token.write_text("next")
    assert read() == "next"


def test_files_to_merge_are_left_to_the_sdk() -> None:
    with pytest.raises(UnsupportedCredentials, match="KUBECONFIG names several files"):
        apiserver_connection.own_connection({"KUBECONFIG": f"/a{os.pathsep}/b"})


@pytest.mark.parametrize(("environ", "through"), [
    ({}, None),
    ({"HTTP_PROXY": "http://proxy:3128"}, None),  # not for an https apiserver
    ({"HTTPS_PROXY": "http://proxy:3128"}, "HTTPS_PROXY"),
    ({"all_proxy": "http://proxy:3128"}, "all_proxy"),
    ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "localhost,.svc"}, None),
    ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "default.svc"}, None),
    ({"HTTPS_PROXY": "http://p:1", "no_proxy": "example.com"}, "HTTPS_PROXY"),
    ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*"}, None),
])
def test_a_proxy_is_followed_by_the_sdks_rule(environ: dict[str, str],
                                              through: str | None) -> None:
    server = "https://kubernetes.default.svc:443"
    assert apiserver_connection.proxied(server, environ) == through


def test_no_proxy_names_the_service_network_by_address() -> None:
    environ = {"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.96.0.0/12"}
    assert apiserver_connection.proxied("https://10.96.0.1:443", environ) is None
    assert apiserver_connection.proxied("https://192.168.1.1:6443", environ) == "HTTPS_PROXY"
    assert apiserver_connection.proxied("https://192.168.1.1:6443",
                                   {**environ, "NO_PROXY": "192.168.1.1:6443"}) is None


def test_a_proxied_apiserver_is_left_to_the_sdk(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path / "config", {"token": "t"})
    environ = {"KUBECONFIG": str(config), "HTTPS_PROXY": "http://proxy:3128"}
    with pytest.raises(UnsupportedCredentials, match=r"HTTPS_PROXY sends https://127\.0\.0\.1:1"):
        apiserver_connection.own_connection(environ)
    assert apiserver_connection.own_connection({**environ, "NO_PROXY": "127.0.0.1"}).server == (
        "https://127.0.0.1:1")


def test_the_sdks_own_failures_are_failed_reads() -> None:
    class Broken:
        def param_serialize(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("exec plugin 'aws' exited 1")

    sdk = object.__new__(apiserver_connection._SdkConnection)
    sdk.api = Broken()
    with pytest.raises(ReadFailed, match="RuntimeError: exec plugin 'aws' exited 1"):
        sdk.request("/api/v1/pods", [], 5, True)


def test_a_cluster_behind_a_proxy_url_is_left_to_the_sdk(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path / "config", {"token": "t"},
                         {"server": "https://k:6443", "proxy-url": "http://proxy:3128"})
    with pytest.raises(UnsupportedCredentials, match="'proxy-url'"):
        apiserver_connection.own_connection({"KUBECONFIG": str(config)})


def test_a_certificate_without_its_key_is_named(tmp_path: Path) -> None:
    (tmp_path / "c.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    config = _kubeconfig(tmp_path / "config", {"client-certificate": "c.crt"})
    with pytest.raises(ValueError, match="a client certificate or a client key, not both"):
        apiserver_connection.from_kubeconfig(config)


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, str]]] = []
    body = b"{}"
    status = 200

    def do_GET(self) -> None:
        type(self).seen.append({"path": self.path, **dict(self.headers)})
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def plain_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Recorder]]:
    handler = type("Handler", (_Recorder,), {"seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    here = apiserver_connection.Connection(f"http://127.0.0.1:{server.server_address[1]}", None,
                                      lambda: "s3cret")
    monkeypatch.setattr(apiserver_reads, "connection", lambda: here)
    yield handler
    server.shutdown()


def test_a_read_says_who_it_is_and_carries_the_token(plain_server: Any) -> None:
    assert apiserver_reads.get_json("/api/v1/pods", [("labelSelector", "a=b")], 5) == {}
    seen = plain_server.seen[0]
    assert seen["path"] == "/api/v1/pods?labelSelector=a%3Db"
    assert seen["User-Agent"] == "ckptdrain-admission"
    assert seen["Authorization"] == "Bearer s3cret"


def test_an_answer_that_is_not_json_is_a_failed_read(plain_server: Any) -> None:
    plain_server.body = b"<html>a proxy's page</html>"
    with pytest.raises(ReadFailed, match="the answer is not JSON"):
        apiserver_reads.get_json("/api/v1/pods", [], 5)
    # An owner is optional knowledge: any failure reads as absent.
    assert apiserver_reads.read_object("batch/v1", "jobs", "ml", "train") is None


def test_the_policy_view_lists_then_watches_from_the_list(
        monkeypatch: pytest.MonkeyPatch) -> None:
    watches: list[dict[str, str]] = []
    done, again = threading.Event(), threading.Event()
    offered: list[Any] = []
    policy = {"metadata": {"name": "llama", "namespace": "ml", "resourceVersion": "4"},
              "spec": {"selector": {"matchLabels": {"app": "a"}}}}

    def get_json(path: str, query: list[tuple[str, str]], timeout: float) -> dict[str, Any]:
        assert path == "/apis/ckptdrain.io/v1beta1/namespaces/ml/checkpointpolicies"
        return {"items": [policy], "metadata": {"resourceVersion": "4"}}

    class Response:
        def stream(self, amt: int) -> Any:
            return iter([json.dumps({"type": "BOOKMARK", "object": {
                "metadata": {"resourceVersion": "9"}}}).encode() + b"\n"])

        def release_conn(self) -> None:
            done.set()

        def close(self) -> None:
            pass

    def stream(path: str, query: list[tuple[str, str]], timeout: Any) -> Response:
        watches.append(dict(query))
        if len(watches) > 1:
            offered.append(mirror.candidates("ml", {"app": "a"}))
            again.set()
            raise ApiError(500, "stop here")
        return Response()

    monkeypatch.setattr(apiserver_reads, "get_json", get_json)
    monkeypatch.setattr(apiserver_reads, "stream", stream)
    mirror = policy_mirror.PolicyMirror()
    stopping = threading.Event()
    policy_mirror.start(mirror, "ml", logging.getLogger("test"), stopping)
    assert done.wait(10) and again.wait(10)
    stopping.set()
    assert watches[0]["resourceVersion"] == "4" and watches[0]["allowWatchBookmarks"] == "true"
    assert watches[1]["resourceVersion"] == "9"  # from the bookmark on
    # Listed, and current through the first watch; with the version each
    # field was written at kept beside it (none: no managedFields here).
    assert offered[0] == [{**policy, version_messages.KEPT_KEY: {}}]


def _pods_by_page(monkeypatch: pytest.MonkeyPatch, pages: list[list[dict[str, Any]]]
                  ) -> list[tuple[list[tuple[str, str]], float]]:
    """get_json answering a pod list page by page; returns the queries made."""
    asked: list[tuple[list[tuple[str, str]], float]] = []

    def get_json(path: str, query: list[tuple[str, str]], timeout: float) -> dict[str, Any]:
        asked.append((query, timeout))
        token = dict(query).get("continue", "0")
        n = int(token)
        more = {"continue": str(n + 1)} if n + 1 < len(pages) else {}
        return {"metadata": more, "items": pages[n]}

    monkeypatch.setattr(apiserver_reads, "get_json", get_json)
    return asked


def _injected(name: str, policy: str = "llama") -> dict[str, Any]:
    return {"metadata": {"name": name, "annotations": {
        "ckptdrain.io/policy": policy, "ckptdrain.io/injected": "true"}}}


def test_the_injected_pod_search_pages_skips_succeeded_and_stops_at_the_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pages = [[_injected("a-0", "other")], [_injected("b-0"), _injected("b-1")], [_injected("c")]]
    asked = _pods_by_page(monkeypatch, pages)
    deadline = time.monotonic() + 3
    found = apiserver_reads.first_injected_pod("ml", "llama", lambda p: True, deadline)
    assert found is not None and found["metadata"]["name"] == "b-0"
    assert len(asked) == 2  # the third page was never read
    first = dict(asked[0][0])
    assert first["labelSelector"] == "ckptdrain.io/inject=true,ckptdrain.io/policy=llama"
    assert first["fieldSelector"] == "status.phase!=Succeeded"
    assert first["limit"] == str(apiserver_reads.POD_PAGE) and "continue" not in first
    assert dict(asked[1][0])["continue"] == "1"
    assert all(0 < t <= 3 for _, t in asked)
    # Nothing wanted: every page of both reads, None.
    assert apiserver_reads.first_injected_pod("ml", "llama", lambda p: False, deadline) is None


def test_the_injected_pod_search_reads_the_policys_pods_then_only_unlabelled_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The apiserver's label selection: pods of other policies are never
    # read; pods injected before the label was set are found by annotation.
    labelled = {**_injected("new-0"), "status": {"phase": "Running"}}
    labelled["metadata"]["labels"] = {"ckptdrain.io/inject": "true",
                                      "ckptdrain.io/policy": "llama"}
    old = _injected("old-0")
    old["metadata"]["labels"] = {"ckptdrain.io/inject": "true"}
    other = _injected("x-0", "other")
    other["metadata"]["labels"] = {"ckptdrain.io/inject": "true",
                                   "ckptdrain.io/policy": "other"}
    pods = [other, labelled, old]
    selected: list[str] = []

    def get_json(path: str, query: list[tuple[str, str]], timeout: float) -> dict[str, Any]:
        selector = dict(query)["labelSelector"]
        selected.append(selector)
        wanted = dict(part.split("=") if "=" in part else (part, None)
                      for part in selector.split(","))
        return {"metadata": {}, "items": [
            p for p in pods if all(
                (p["metadata"]["labels"].get(k) == v) if not k.startswith("!")
                else k[1:] not in p["metadata"]["labels"] for k, v in wanted.items())]}

    monkeypatch.setattr(apiserver_reads, "get_json", get_json)
    deadline = time.monotonic() + 3
    names = {"new-0", "old-0"}
    found = apiserver_reads.first_injected_pod(
        "ml", "llama", lambda p: p["metadata"]["name"] in names, deadline)
    assert found is not None and found["metadata"]["name"] == "new-0"
    assert selected == ["ckptdrain.io/inject=true,ckptdrain.io/policy=llama"]
    names.discard("new-0")
    found = apiserver_reads.first_injected_pod(
        "ml", "llama", lambda p: p["metadata"]["name"] in names, deadline)
    assert found is not None and found["metadata"]["name"] == "old-0"
    assert selected[1:] == ["ckptdrain.io/inject=true,ckptdrain.io/policy=llama",
                            "ckptdrain.io/inject=true,!ckptdrain.io/policy"]
    # A name too long for a label: its pods carry none.
    apiserver_reads.first_injected_pod("ml", "p" * 64, lambda p: True, deadline)
    assert selected[3:] == ["ckptdrain.io/inject=true,!ckptdrain.io/policy"]


def test_the_injected_pod_search_gives_up_at_its_deadline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _pods_by_page(monkeypatch, [[]])
    with pytest.raises(ReadFailed, match="longer than an admission may wait"):
        apiserver_reads.first_injected_pod("ml", "llama", lambda p: True, time.monotonic() - 1)


def test_admission_reads_end_before_the_webhook_timeout() -> None:
    values = yaml.safe_load((Path(__file__).parents[3] / "charts/ckptdrain/values.yaml")
                            .read_text())
    assert values["webhook"]["timeoutSeconds"] > apiserver_reads.ADMISSION_READ_TIMEOUT_S
