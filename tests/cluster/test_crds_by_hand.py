"""docs/api-versions.md's command for installing the ckptdrain CRDs without
the chart (crds.install=false), run as written on a real apiserver, twice
(once per upgrade): the CRD then converts through the named release's
webhook Service and gets its CA from that release's Certificate, and the
second run is accepted as the first (no field-manager conflict). An
apiserver of its own: the command replaces the CRD's conversion stanza."""

from __future__ import annotations

import json
import os
import re
import subprocess

from cluster_helpers import helm_binary
from operator_process import repo_root

from support import apiserver


def crds_by_hand_block() -> str:
    """The shell block of docs/api-versions.md's "Installing the CRDs yourself"."""
    text = (repo_root() / "docs" / "api-versions.md").read_text()
    after = text[text.index("## Installing the CRDs yourself"):]
    return str(re.findall(r"```sh\n(.*?)```", after, re.S)[0])


def test_the_documented_commands_point_the_crd_at_the_release() -> None:
    binaries, helm = apiserver.binaries_or_fail(), helm_binary()
    with apiserver.running() as cluster:
        env = {**cluster.env(),
               "PATH": f"{binaries.kubectl.parent}:{helm.parent}:{os.environ['PATH']}"}
        for _ in range(2):  # install, then the next upgrade's run
            ran = subprocess.run(["bash", "-euo", "pipefail", "-c", crds_by_hand_block()],
                                 cwd=repo_root(), env=env, capture_output=True, text=True,
                                 timeout=120)
            assert ran.returncode == 0, ran.stderr
        crd = json.loads(cluster.kubectl("get", "crd", "checkpointpolicies.ckptdrain.io",
                                         "-o", "json").stdout)
        names = cluster.kubectl("get", "crd", "-o", "name").stdout.split()
    webhook = crd["spec"]["conversion"]["webhook"]
    assert webhook["clientConfig"]["service"] == {
        "namespace": "ml-ops", "name": "train-ckptdrain-webhook", "path": "/convert",
        "port": 443}
    assert crd["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        "ml-ops/train-ckptdrain")
    # The other ckptdrain CRDs come with it.
    for other in ("checkpoints.ckptdrain.io", "checkpointshares.ckptdrain.io",
                  "checkpointclasses.ckptdrain.io"):
        assert f"customresourcedefinition.apiextensions.k8s.io/{other}" in names
    # Both served, v1beta1 stored: v1alpha1 reads convert through that Service.
    assert {v["name"]: (v["served"], v["storage"]) for v in crd["spec"]["versions"]} == {
        "v1alpha1": (True, False), "v1beta1": (True, True)}
