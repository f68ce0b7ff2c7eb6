"""The admission process's own apiserver client (apiserver_reads.py) without
a server: its kubeconfig reading, its rotating token file, its watch lines
and its errors; and that the admission process never loads the `kubernetes`
package. Against a real apiserver: tests/cluster/test_apiserver_reads.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptdrain.operator import apiserver_reads
from ckptdrain.operator.apiserver_reads import ApiError, TokenFile, UnsupportedCredentials


def test_the_admission_process_never_loads_the_kubernetes_package() -> None:
    # What it imports to serve, with the reads and both views; importing the
    # SDK would cost about 20 MiB of its resident memory (docs/scale.md).
    code = ("import sys\n"
            "import ckptdrain.operator.admission_process\n"
            "from ckptdrain.operator import apiserver_reads, holder_mirror, policy_mirror\n"
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
        apiserver_reads.from_kubeconfig(config)


def test_a_missing_context_or_server_names_what_is_missing(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text(json.dumps({"current-context": "gone", "contexts": []}))
    with pytest.raises(ValueError, match="no entry named 'gone' in contexts"):
        apiserver_reads.from_kubeconfig(config)
    _kubeconfig(config, {"token": "t"}, {"insecure-skip-tls-verify": True})
    with pytest.raises(ValueError, match="cluster 'k' has no server"):
        apiserver_reads.from_kubeconfig(config)


def test_a_token_file_of_the_kubeconfig_is_relative_to_it(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-file")
    found = apiserver_reads.from_kubeconfig(_kubeconfig(tmp_path / "config",
                                                        {"tokenFile": "token"}))
    assert found.token() == "from-file"
    assert found.server == "https://127.0.0.1:1"


def test_outside_a_pod_there_is_no_in_cluster_connection(tmp_path: Path) -> None:
    assert apiserver_reads.in_cluster({}, tmp_path) is None
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert apiserver_reads.in_cluster(env, tmp_path) is None  # no token mounted


def test_an_error_keeps_the_apiserver_message_and_no_credential() -> None:
    class Response:
        status, reason = 403, "Forbidden"
        data = json.dumps({"kind": "Status", "message": 'pods is forbidden: User "x" '
                           'cannot list resource "pods"'}).encode()

    with pytest.raises(ApiError) as raised:
        apiserver_reads._raise_for(Response())
    assert raised.value.status == 403
    assert str(raised.value) == ('(403) Forbidden: pods is forbidden: User "x" cannot list '
                                 'resource "pods"')
