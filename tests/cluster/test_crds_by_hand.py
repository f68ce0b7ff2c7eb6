"""docs/api-versions.md's commands for installing the CheckpointPolicy CRD
without the chart (crds.install=false), run as written on a real apiserver:
the CRD then converts through the named release's webhook Service and gets
its CA from that release's Certificate, as the chart would render it
(tests/chart/test_chart_conversion.py checks the names against the chart).
An apiserver of its own: the commands replace the CRD's conversion stanza."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from operator_process import repo_root

from support import apiserver


def crds_by_hand_block() -> str:
    """The shell block of docs/api-versions.md's "Installing the CRDs yourself"."""
    text = (repo_root() / "docs" / "api-versions.md").read_text()
    after = text[text.index("## Installing the CRDs yourself"):]
    return str(re.findall(r"```sh\n(.*?)```", after, re.S)[0])


def test_the_documented_commands_point_the_crd_at_the_release() -> None:
    try:
        binaries = apiserver.find_binaries()
    except apiserver.MissingBinaries as error:
        pytest.fail(str(error), pytrace=False)
    with apiserver.running() as cluster:
        ran = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", crds_by_hand_block()], cwd=repo_root(),
            env={**cluster.env(), "PATH": f"{binaries.kubectl.parent}:{os.environ['PATH']}"},
            capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr
        crd = json.loads(cluster.kubectl("get", "crd", "checkpointpolicies.ckptdrain.io",
                                         "-o", "json").stdout)
    webhook = crd["spec"]["conversion"]["webhook"]
    assert webhook["clientConfig"]["service"] == {
        "namespace": "ml-ops", "name": "train-ckptdrain-webhook", "path": "/convert",
        "port": 443}
    assert crd["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        "ml-ops/train-ckptdrain")
    # Still only v1alpha1 served: nothing converts through it this release.
    assert [v["name"] for v in crd["spec"]["versions"] if v["served"]] == ["v1alpha1"]
