"""The apiserver converts CheckpointPolicies through the admission process's
/convert (admission/process.py, the process each operator replica runs):
its answers are our pure converter's (`convert`) both ways, reads of
v1alpha1 fail while nothing answers there, and v1beta1 (stored) reads and
docs/install.md's clean-up never need it. The apiserver, CRD and webhook
are this directory's (conftest.py)."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from typing import Any

from cluster_helpers import wait_for
from conversion_objects import ALPHA, BETA, alpha_policy, read, resource
from operator_process import repo_root

from ckptdrain.contract.policy_versions import convert
from support.apiserver import Cluster
from support.conversion_server import ConversionServer


def converted(obj: dict[str, Any], desired: str) -> dict[str, Any]:
    """What our converter makes of `obj` in `desired`."""
    return dict(convert(copy.deepcopy(obj), desired))


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
    # Stored at v1beta1: read back at v1alpha1 in v1beta1's spelling.
    assert json.loads(made.stdout)["spec"]["interval"] == "24h"
    own_cluster.kubectl("patch", "-n", namespace, resource(ALPHA), "llama",
                        "--subresource=status", "--type=merge", "-p", json.dumps(
                            {"status": {"lastRestoreAgreement": {"round": 1, "pods": 2,
                                                                 "startedAt": 1764464523.5},
                                        "goodput": {"heldSince": 1764460000,
                                                    "endedAt": None}}}))
    before = server.settled()
    alpha = read(own_cluster, namespace, ALPHA, "llama")
    wait_for(lambda: server.conversions() > before, timeout_s=10,
             what="the process to report the ConversionReview the apiserver sent it")
    beta = read(own_cluster, namespace, BETA, "llama")
    assert alpha["apiVersion"] == ALPHA and beta["apiVersion"] == BETA
    same_object(alpha, converted(beta, ALPHA))
    same_object(beta, converted(alpha, BETA))
    assert alpha["status"]["goodput"]["heldSince"] == 1764460000
    # The spellings v1beta1 has.
    assert (beta["spec"]["interval"], beta["spec"]["overlap"]) == ("24h", "10%")

    # A list without a version is served in the preferred one, v1beta1.
    listed = json.loads(own_cluster.kubectl("get", "-n", namespace, "checkpointpolicies",
                                            "-o", "json").stdout)["items"]
    assert [i["apiVersion"] for i in listed] == [BETA]
    same_object(listed[0], beta)


def test_a_v1alpha1_write_is_stored_as_our_converter_makes_it(
        own_cluster: Cluster, server: ConversionServer, namespace: str) -> None:
    """The other way: the apiserver stores v1beta1, so a v1alpha1 create is
    converted by /convert before it reaches etcd."""
    made = json.loads(own_cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "json",
                                          input=json.dumps(alpha_policy("gpt"))).stdout)
    assert made["apiVersion"] == ALPHA
    stored = read(own_cluster, namespace, BETA, "gpt")
    same_object(stored, {**converted(made, BETA), "metadata": stored["metadata"]})
    assert stored["metadata"]["uid"] == made["metadata"]["uid"]
    assert read(own_cluster, namespace, ALPHA, "gpt")["spec"] == made["spec"]


def uninstall_block() -> str:
    """The shell block of docs/install.md's "Versions and the conversion webhook"."""
    text = (repo_root() / "docs" / "install.md").read_text()
    after = text[text.index("### Versions and the conversion webhook"):]
    block = re.findall(r"```sh\n(.*?)```", after, re.S)[0]
    assert "checkpointpolicies.v1beta1.ckptdrain.io" in block
    return str(block)


def kubectl_dir(cluster: Cluster) -> str:
    return str(cluster.binaries.kubectl.parent)


def test_without_the_webhook_v1alpha1_reads_fail_and_v1beta1_reads_work(
        own_cluster: Cluster, server: ConversionServer, namespace: str) -> None:
    written = converted(alpha_policy("down"), BETA)
    written.pop("status", None)
    own_cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(written))
    server.stop()
    try:
        failed = read(own_cluster, namespace, ALPHA, "down", check=False)
        assert failed.returncode != 0
        assert "conversion" in failed.stderr.lower(), failed.stderr
        # What the operator and every v1beta1 client read: never converted.
        listed = own_cluster.kubectl("get", "-n", namespace, "checkpointpolicies")
        assert "down" in listed.stdout
        assert read(own_cluster, namespace, BETA, "down")["spec"]["interval"] == "24h"
        # The clean-up docs/install.md gives, as written, works with no
        # replica answering.
        ran = subprocess.run(["bash", "-euo", "pipefail", "-c", uninstall_block()],
                             env={**own_cluster.env(), "PATH": f"{kubectl_dir(own_cluster)}:"
                                  f"{os.environ['PATH']}"},
                             capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr
        gone = own_cluster.kubectl("get", "-n", namespace, resource(BETA), "down",
                                   "--ignore-not-found", "-o", "name")
        assert gone.stdout.strip() == ""
    finally:
        server.start()
    own_cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(written))
    wait_for(lambda: read(own_cluster, namespace, ALPHA, "down", check=False).returncode == 0,
             what="v1alpha1 reads once the webhook answers again")

