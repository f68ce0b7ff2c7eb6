"""The apiserver converts CheckpointPolicies through the admission process's
/convert (admission/process.py, the process each operator replica runs):
its answers are our pure converter's (`convert`) both ways, reads of
v1beta1 fail while nothing answers there, and v1alpha1 (stored) reads and
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
    assert json.loads(made.stdout)["spec"]["interval"] == "1d"  # stored as written
    own_cluster.kubectl("patch", "-n", namespace, resource(ALPHA), "llama",
                        "--subresource=status", "--type=merge", "-p", json.dumps(
                            {"status": {"lastRestoreAgreement": {"round": 1, "pods": 2,
                                                                 "startedAt": 1764464523.5},
                                        "goodput": {"heldSince": 1764460000,
                                                    "endedAt": None}}}))
    stored = read(own_cluster, namespace, ALPHA, "llama")
    assert stored["apiVersion"] == ALPHA

    before = server.settled()
    beta = read(own_cluster, namespace, BETA, "llama")
    same_object(beta, converted(stored, BETA))
    wait_for(lambda: server.conversions() > before, timeout_s=10,
             what="the process to report the ConversionReview the apiserver sent it")
    # The spellings v1beta1 has.
    assert (beta["spec"]["interval"], beta["spec"]["overlap"]) == ("24h", "10%")

    # A list without a version is served in the preferred one, v1beta1.
    listed = json.loads(own_cluster.kubectl("get", "-n", namespace, "checkpointpolicies",
                                            "-o", "json").stdout)["items"]
    assert [i["apiVersion"] for i in listed] == [BETA]
    same_object(listed[0], beta)


def test_a_v1beta1_write_is_stored_as_our_converter_makes_it(
        own_cluster: Cluster, server: ConversionServer, namespace: str) -> None:
    """The other way: the apiserver stores v1alpha1, so a v1beta1 create is
    converted by /convert before it reaches etcd."""
    first = converted(alpha_policy("gpt"), BETA)
    first.pop("status", None)
    made = json.loads(own_cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "json",
                                          input=json.dumps(first)).stdout)
    assert made["apiVersion"] == BETA
    stored = read(own_cluster, namespace, ALPHA, "gpt")
    same_object(stored, {**converted(made, ALPHA), "metadata": stored["metadata"]})
    assert stored["metadata"]["uid"] == made["metadata"]["uid"]
    # v1beta1 → v1alpha1 → v1beta1 gives back what was written.
    assert read(own_cluster, namespace, BETA, "gpt")["spec"] == made["spec"]


def uninstall_block() -> str:
    """The shell block of docs/install.md's "Versions and the conversion webhook"."""
    text = (repo_root() / "docs" / "install.md").read_text()
    after = text[text.index("### Versions and the conversion webhook"):]
    block = re.findall(r"```sh\n(.*?)```", after, re.S)[0]
    assert "checkpointpolicies.v1alpha1.ckptdrain.io" in block
    return str(block)


def kubectl_dir(cluster: Cluster) -> str:
    return str(cluster.binaries.kubectl.parent)


def test_without_the_webhook_v1beta1_reads_fail_and_v1alpha1_reads_work(
        own_cluster: Cluster, server: ConversionServer, namespace: str) -> None:
    own_cluster.kubectl("create", "-n", namespace, "-f", "-",
                        input=json.dumps(alpha_policy("down")))
    server.stop()
    try:
        failed = read(own_cluster, namespace, BETA, "down", check=False)
        assert failed.returncode != 0
        assert "conversion" in failed.stderr.lower(), failed.stderr
        listed = own_cluster.kubectl("get", "-n", namespace, "checkpointpolicies", check=False)
        assert listed.returncode != 0 and "conversion" in listed.stderr.lower()
        # What the operator and every v1alpha1 client read: never converted.
        assert read(own_cluster, namespace, ALPHA, "down")["spec"]["interval"] == "1d"
        # The clean-up docs/install.md gives, as written, works with no
        # replica answering.
        ran = subprocess.run(["bash", "-euo", "pipefail", "-c", uninstall_block()],
                             env={**own_cluster.env(), "PATH": f"{kubectl_dir(own_cluster)}:"
                                  f"{os.environ['PATH']}"},
                             capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr
        gone = own_cluster.kubectl("get", "-n", namespace, resource(ALPHA), "down",
                                   "--ignore-not-found", "-o", "name")
        assert gone.stdout.strip() == ""
    finally:
        server.start()
    wait_for(lambda: own_cluster.kubectl("get", "-n", namespace, "checkpointpolicies",
                                         check=False).returncode == 0,
             what="v1beta1 reads once the webhook answers again")

