"""docs/install.md, "Moving from the hostPath mode", run as written against
a real kube-apiserver: an installation in the hostPath mode with a pod of
each mode running, the page's switch to the CSI driver, its listing of the
pods still on hostPath, its removal of the old node directories, and its
way back to hostPath.

The test apiserver runs no controllers, so nothing becomes Ready: the
blocks run with their waits (`--wait`, `rollout status`) taken out, and
this test checks what those waits stand for, the objects themselves."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.chart.support import REPO, Tools, adopt_crds
from tests.docs.blocks import Block, parse
from tests.docs.pages import RUN_BY_THEIR_OWN_TEST
from tests.support.apiserver import Cluster

pytestmark = pytest.mark.cluster

PAGE = REPO / "docs" / "install.md"
SECTION = RUN_BY_THEIR_OWN_TEST[PAGE]
#: What users installed: 0.1.0, whose default node tier was hostPath.
RELEASED = REPO / "tests" / "fixtures" / "released" / "ckptdrain-0.1.0.tgz"
RELEASE = NAMESPACE = "ckptdrain"
TRAINING = "ml-a"


def section_blocks() -> list[Block]:
    """The section's shell blocks, in page order."""
    lines = PAGE.read_text().split("\n")
    start = lines.index(SECTION) + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(("## ", "### ")))
    return [b for b in parse(PAGE) if start < b.line <= end + 1 and b.lang == "sh"]


def without_waits(block: Block) -> str:
    """The block less what waits for controllers this apiserver does not run."""
    kept = [line for line in block.text.split("\n") if "rollout status" not in line]
    return "\n".join(kept).replace(" --wait", "")


def run_block(text: str, cluster: Cluster, tools: Tools, **env: str) -> str:
    path = os.pathsep.join([str(tools.helm.parent), str(cluster.binaries.kubectl.parent),
                            os.environ.get("PATH", "")])
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=REPO, text=True,
                          capture_output=True, timeout=300,
                          env={**cluster.env(), "PATH": path, **env})
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def pod(name: str, volume: dict[str, Any]) -> str:
    """A pod as the webhook left it in one mode: its node tier volume."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": TRAINING,
                     "labels": {"ckptdrain.io/inject": "true"}},
        "spec": {"nodeName": "node-a", "containers": [{"name": "trainer", "image": "t"}],
                 "volumes": [{"name": "ckptdrain-local", **volume}]}})


def operator_env(cluster: Cluster) -> dict[str, str]:
    deployment = json.loads(cluster.kubectl("get", "deployment", "-n", NAMESPACE, RELEASE,
                                            "-o", "json").stdout)
    return {e["name"]: e.get("value", "")
            for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def exists(cluster: Cluster, *what: str) -> bool:
    return cluster.kubectl("get", *what, check=False).returncode == 0


def test_the_page_moves_an_installation_off_hostpath_and_back(
        tools: Tools, cluster: Cluster, tmp_path: Path) -> None:
    switch, remove_old, stay = section_blocks()
    assert "rollout status daemonset/ckptdrain-csi-node" in switch.text
    for ns in (TRAINING, NAMESPACE):
        cluster.kubectl("create", "namespace", ns)
    # Two running pods, made before the webhook exists: one of each mode.
    cluster.kubectl("apply", "-f", "-", input=pod("on-hostpath", {"hostPath": {
        "path": "/mnt/ckptdrain/ml-a/train", "type": "DirectoryOrCreate"}}))
    cluster.kubectl("apply", "-f", "-", input=pod("on-csi", {"csi": {
        "driver": "node.ckptdrain.io", "volumeAttributes": {"policy": "train"}}}))
    adopt_crds(cluster, RELEASE, NAMESPACE)
    # An installation of the hostPath mode as 0.1.0 made it: its own
    # defaults, no value named (--reuse-values fails on such a release).
    tools.run("helm", "install", RELEASE, str(RELEASED), "-n", NAMESPACE, env=cluster.env())
    try:
        assert "CKPTDRAIN_NODE_TIER" not in operator_env(cluster)
        assert not exists(cluster, "csidriver", "node.ckptdrain.io")

        listed = run_block(without_waits(switch), cluster, tools)
        labels = json.loads(cluster.kubectl("get", "namespace", NAMESPACE, "-o", "json").stdout)[
            "metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
        assert exists(cluster, "daemonset", "-n", NAMESPACE, "ckptdrain-csi-node")
        assert exists(cluster, "csidriver", "node.ckptdrain.io")
        env = operator_env(cluster)
        assert (env["CKPTDRAIN_NODE_TIER"], env["CKPTDRAIN_CSI_DRIVER"]) == (
            "csi", "node.ckptdrain.io")
        assert "ckptdrain-0.1.0" not in tools.run("helm", "list", "-n", NAMESPACE,
                                                  env=cluster.env()).stdout
        # The pods still on hostPath, with their node and directory; not the other.
        lines = listed.strip().split("\n")
        header = next(i for i, line in enumerate(lines) if line.startswith("NAMESPACE "))
        rows = [line.split() for line in lines[header:]]
        assert rows == [["NAMESPACE", "POD", "NODE", "HOSTPATH"],
                        [TRAINING, "on-hostpath", "node-a", "/mnt/ckptdrain/ml-a/train"]]

        root = tmp_path / "allowed-root"
        (root / "ml-a" / "train" / "writer-0").mkdir(parents=True)
        (root / "ml-a" / "train" / "writer-0" / "shard").write_bytes(b"x" * 1024)
        (root / "ml-b" / "eval").mkdir(parents=True)
        shown = run_block(remove_old.text, cluster, tools, ALLOWED_ROOT=str(root))
        assert {line.split()[-1] for line in shown.strip().split("\n")} == {
            str(root / "ml-a" / "train"), str(root / "ml-b" / "eval")}
        assert root.is_dir() and not list(root.iterdir())

        run_block(without_waits(stay), cluster, tools)
        assert not exists(cluster, "daemonset", "-n", NAMESPACE, "ckptdrain-csi-node")
        assert not exists(cluster, "csidriver", "node.ckptdrain.io")
        assert "CKPTDRAIN_NODE_TIER" not in operator_env(cluster)
    finally:
        tools.run("helm", "uninstall", RELEASE, "-n", NAMESPACE, env=cluster.env(), check=False)
