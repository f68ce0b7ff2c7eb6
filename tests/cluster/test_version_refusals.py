"""Refusals in the version the policy was written at, through a real
apiserver (docs/api-versions.md, "What a refusal says", whose example this
creates): the policy webhook refuses a v1beta1 create in v1beta1's
spellings with the value as written, and the same value at v1alpha1 as it
always did; so it does when registered for one version alone (neither
the chart nor Kopf does) and the apiserver sends it the other version's
requests converted, for this value, which converts there and back
unchanged (another may come back respelled: docs/api-versions.md). A
v1alpha1 bytesPerParameter whose checkpoint size is no finite number is
refused naming that field. The operator, reading
v1alpha1, says an invalid policy's InvalidSpec status and Event in the
version each field found wrong was written at (its managedFields
owner's), not the newest writer's; and pod admission, refusing a pod such
a policy selects, says it the same way.

The CRD is crds/checkpointpolicies.yaml as shipped, converting through the
admission process (the ConversionServer, by URL); the policy webhook is
that process too, registered here as the chart registers it, and so is
the pod webhook. Its own
apiserver: this module registers webhooks and runs an operator of its own,
which the session's would meet."""

from __future__ import annotations

import base64
import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_helpers import policy_crd_source, wait_for
from operator_process import OperatorProcess, repo_root
from tests.docs.refusal_example import RefusalExample, refusal_example

from ckptdrain.contract.policy_versions import V1ALPHA1, V1BETA1, convert
from ckptdrain.operator.admission.rules import MUTATE_ID, VALIDATE_ID
from support import apiserver
from support.apiserver import Cluster, free_port
from support.conversion_server import ConversionServer, converting_to

WEBHOOK = "version-refusals.ckptdrain.io"


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    apiserver.binaries_or_fail()
    with apiserver.running(tmp_path_factory.mktemp("refusals-apiserver")) as running:
        yield running


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("refusals-certs")
    made = apiserver.make_ca(directory, "webhook-ca")
    cert, key = apiserver.make_cert(directory, "webhook", made)
    return {"ca": made[0], "cert": cert, "key": key}


@pytest.fixture(scope="module")
def server(own_cluster: Cluster, ca: dict[str, Path]) -> Iterator[ConversionServer]:
    """The admission process, answering /convert for the CRD (and the
    policy webhook once registered); the operator's other CRDs beside it."""
    port = free_port()
    crd = converting_to(policy_crd_source(), f"https://127.0.0.1:{port}/convert",
                        ca["ca"].read_bytes())
    own_cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(crd))
    for name in ("checkpoints", "checkpointshares", "checkpointclasses"):
        own_cluster.kubectl("apply", "--server-side", "-f",
                            str(repo_root() / "crds" / f"{name}.yaml"))
    apiserver.wait_established(own_cluster)
    running = ConversionServer(own_cluster, ca["cert"], ca["key"], port)
    running.start()
    yield running
    running.stop()


@pytest.fixture
def namespace(own_cluster: Cluster, server: ConversionServer) -> Iterator[str]:
    name = f"refusals-{time.monotonic_ns() % 10**8}"
    own_cluster.kubectl("create", "namespace", name)
    yield name
    own_cluster.kubectl("delete", "validatingwebhookconfiguration", WEBHOOK,
                        "--ignore-not-found")
    # v1alpha1 named: a cleanup never depends on the webhook.
    own_cluster.kubectl("delete", "-n", name, "checkpointpolicies.v1alpha1.ckptdrain.io",
                        "--all", "--wait=false", check=False)
    own_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def register_policy_webhook(cluster: Cluster, server: ConversionServer, ca_pem: bytes,
                            versions: list[str]) -> None:
    """The policy validating webhook as the chart registers it (CREATE and
    UPDATE, matchPolicy Equivalent, failing closed), for `versions`."""
    hook = {"name": "checkpointpolicies.validate.ckptdrain.io",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": f"https://127.0.0.1:{server.port}/{VALIDATE_ID}",
                             "caBundle": base64.b64encode(ca_pem).decode()},
            "rules": [{"apiGroups": ["ckptdrain.io"], "apiVersions": versions,
                       "operations": ["CREATE", "UPDATE"],
                       "resources": ["checkpointpolicies"], "scope": "Namespaced"}],
            "failurePolicy": "Fail", "matchPolicy": "Equivalent", "sideEffects": "None",
            "timeoutSeconds": 10}
    cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration", "metadata": {"name": WEBHOOK},
        "webhooks": [hook]}))


def at_both_versions(example: RefusalExample, name: str) -> dict[str, dict[str, Any]]:
    """The page's policy named `name`, at v1beta1 as shown and at v1alpha1
    as the converter spells it (capacity "1000000000000")."""
    beta = copy.deepcopy(example.policy)
    beta["metadata"]["name"] = name
    beta["spec"]["selector"] = {"matchLabels": {"app": name}}
    alpha = convert(copy.deepcopy(beta), V1ALPHA1)
    assert alpha["spec"]["localTier"]["capacity"] == "1000000000000"
    return {V1BETA1: beta, V1ALPHA1: alpha}


def create(cluster: Cluster, namespace: str, obj: dict[str, Any]) -> str:
    """What kubectl says of a create expected to be refused."""
    made = cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(obj),
                           check=False)
    assert made.returncode != 0, made.stdout
    return made.stderr


def nothing_created(cluster: Cluster, namespace: str) -> None:
    listed = json.loads(cluster.kubectl(
        "get", "-n", namespace, "checkpointpolicies.v1alpha1.ckptdrain.io", "-o",
        "json").stdout)
    assert listed["items"] == []


@pytest.mark.parametrize("versions", [["*"], ["v1beta1"], ["v1alpha1"]],
                         ids=["every-version", "v1beta1", "v1alpha1"])
def test_a_refused_create_is_told_in_the_version_it_was_written_at(
        own_cluster: Cluster, server: ConversionServer, ca: dict[str, Path], namespace: str,
        versions: list[str]) -> None:
    # ["*"]: as the chart registers it, each request sent as written.
    # ["v1beta1"]: a v1alpha1 request sent converted, requestKind saying
    # v1alpha1; ["v1alpha1"]: a v1beta1 one, the other way.
    register_policy_webhook(own_cluster, server, ca["ca"].read_bytes(), versions)
    example = refusal_example()
    policies = at_both_versions(example, "small-tier")
    at_beta = create(own_cluster, namespace, policies[V1BETA1])
    assert example.at_v1beta1 in at_beta, at_beta
    at_alpha = create(own_cluster, namespace, policies[V1ALPHA1])
    assert example.at_v1alpha1 in at_alpha, at_alpha
    nothing_created(own_cluster, namespace)


def test_a_checkpoint_size_past_any_number_is_refused_naming_its_field(
        own_cluster: Cluster, server: ConversionServer, ca: dict[str, Path],
        namespace: str) -> None:
    register_policy_webhook(own_cluster, server, ca["ca"].read_bytes(), ["*"])
    alpha = at_both_versions(refusal_example(), "huge")[V1ALPHA1]
    alpha["spec"]["model"] = {"parameters": "70B", "bytesPerParameter": 1e300}
    refused = create(own_cluster, namespace, alpha)
    assert ("denied the request: spec.model.bytesPerParameter: expected a value whose "
            "model.parameters × model.bytesPerParameter") in refused, refused
    nothing_created(own_cluster, namespace)


def invalid_spec(cluster: Cluster, namespace: str, name: str) -> tuple[str, list[str]]:
    """The Ready condition's message of an InvalidSpec policy, and the
    messages of its InvalidSpec Events."""
    def ready() -> dict[str, Any] | None:
        got = json.loads(cluster.kubectl(
            "get", "-n", namespace, "checkpointpolicies.v1alpha1.ckptdrain.io", name, "-o",
            "json").stdout)
        found = next((c for c in (got.get("status") or {}).get("conditions") or []
                      if c["type"] == "Ready" and c["reason"] == "InvalidSpec"), None)
        return found
    condition = wait_for(ready, timeout_s=60, what=f"policy {name} reported InvalidSpec")

    def events() -> list[tuple[str, str]]:
        listed = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o",
                                            "json").stdout)["items"]
        return [(e["message"], e["involvedObject"].get("apiVersion")) for e in listed
                if e.get("reason") == "InvalidSpec" and e["involvedObject"].get("name") == name]
    posted = wait_for(events, what=f"an InvalidSpec Event of {name}")
    # Each names the policy at v1beta1, the version the operator reads.
    assert {version for _, version in posted} == {"ckptdrain.io/v1beta1"}, posted
    return str(condition["message"]), [message for message, _ in posted]


def patched_at_v1beta1_then_labelled(cluster: Cluster, namespace: str,
                                     example: RefusalExample) -> str:
    """The page's policy made valid and created at v1alpha1 by a GitOps
    manager; its capacity then patched at v1beta1 to the refused value, by
    someone else; the GitOps manager then labels it at v1alpha1, which
    moves its managedFields entry's time past the patch's, though it no
    longer owns the capacity. The policy's name."""
    name = "small-patched"
    alpha = at_both_versions(example, name)[V1ALPHA1]
    alpha["spec"]["localTier"]["capacity"] = "2000000000000"
    cluster.kubectl("create", "-n", namespace, "--field-manager=gitops", "-f", "-",
                    input=json.dumps(alpha))
    capacity = example.policy["spec"]["localTier"]["capacity"]
    cluster.kubectl("patch", "-n", namespace, "checkpointpolicies.v1beta1.ckptdrain.io", name,
                    "--type=merge", "-p",
                    json.dumps({"spec": {"localTier": {"capacity": capacity}}}))
    # managedFields' times are to the second: the label comes a second later.
    time.sleep(1.1)
    cluster.kubectl("label", "-n", namespace, "--field-manager=gitops",
                    "checkpointpolicies.v1alpha1.ckptdrain.io", name, "team=ml")
    return name


def test_the_operator_says_an_invalid_policy_in_the_version_its_field_was_written_at(
        own_cluster: Cluster, server: ConversionServer, namespace: str,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # No policy webhook yet: the invalid policies are stored, as one admitted
    # under an earlier rule (or with the webhook down) would be.
    example = refusal_example()
    written = {version: at_both_versions(example, name)[version]
               for version, name in ((V1BETA1, "small-beta"), (V1ALPHA1, "small-alpha"))}
    for obj in written.values():
        own_cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(obj))
    patched = patched_at_v1beta1_then_labelled(own_cluster, namespace, example)
    operator = OperatorProcess(own_cluster, tmp_path_factory.mktemp("refusals-operator"))
    operator.start()
    try:
        for name, told in ((written[V1BETA1]["metadata"]["name"], example.at_v1beta1),
                           (written[V1ALPHA1]["metadata"]["name"], example.at_v1alpha1),
                           # The capacity's writer wrote v1beta1, whoever wrote last.
                           (patched, example.at_v1beta1)):
            message, events = invalid_spec(own_cluster, namespace, name)
            managed = json.loads(own_cluster.kubectl(
                "get", "-n", namespace, "checkpointpolicies.v1alpha1.ckptdrain.io", name,
                "-o", "jsonpath={.metadata.managedFields}").stdout)
            assert message == told, (name, message, managed)
            assert told in events, (name, events)
    finally:
        operator.stop()


POD_WEBHOOK = "version-refusals-pods.ckptdrain.io"


def register_pod_webhook(cluster: Cluster, server: ConversionServer, ca_pem: bytes,
                         namespace: str) -> None:
    """The pod injection webhook as the chart registers it (opted-in pods,
    failing closed), for `namespace` alone."""
    hook = {"name": "pods.inject.ckptdrain.io", "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": f"https://127.0.0.1:{server.port}/{MUTATE_ID}",
                             "caBundle": base64.b64encode(ca_pem).decode()},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"], "scope": "Namespaced"}],
            "objectSelector": {"matchLabels": {"ckptdrain.io/inject": "true"}},
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "failurePolicy": "Fail", "sideEffects": "None", "timeoutSeconds": 10,
            "reinvocationPolicy": "IfNeeded"}
    cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration", "metadata": {"name": POD_WEBHOOK},
        "webhooks": [hook]}))


def test_pod_admission_says_the_selecting_policys_problem_in_its_writers_version(
        own_cluster: Cluster, server: ConversionServer, ca: dict[str, Path],
        namespace: str) -> None:
    # Stored invalid (no policy webhook), as the operator's status test has them.
    example = refusal_example()
    written = {version: at_both_versions(example, name)[version]
               for version, name in ((V1BETA1, "pods-beta"), (V1ALPHA1, "pods-alpha"))}
    for obj in written.values():
        own_cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(obj))
    register_pod_webhook(own_cluster, server, ca["ca"].read_bytes(), namespace)
    try:
        for version, told in ((V1BETA1, example.at_v1beta1), (V1ALPHA1, example.at_v1alpha1)):
            name = written[version]["metadata"]["name"]
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"w-{name}",
                                "labels": {"app": name, "ckptdrain.io/inject": "true"}},
                   "spec": {"containers": [{"name": "trainer", "image": "t"}]}}
            refused = create(own_cluster, namespace, pod)
            # Under Refuse (the default), the refusal names the policy and
            # says its problem as its own status does.
            assert f"CheckpointPolicy {name} in {namespace} selects this pod" in refused, \
                refused
            assert f"but is invalid ({told}); fix the policy" in refused, refused
    finally:
        own_cluster.kubectl("delete", "mutatingwebhookconfiguration", POD_WEBHOOK,
                            "--ignore-not-found")
