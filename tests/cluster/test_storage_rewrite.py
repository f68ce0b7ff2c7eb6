"""The storage version migration's rewrite, proven on the real apiserver
where nothing else writes: policies created while the CRD stores v1alpha1
stay held at v1alpha1 in etcd after the CRD flips to v1beta1 (the flip
alone rewrites nothing), and only the migration's own writes put them at
v1beta1 there. Both ways a migration runs: the leader's pass
(migration/run.py `migrate_once`, in this process) and the by-hand script
of docs/api-versions.md (for operators watching one namespace), which must
leave storedVersions alone when a rewrite fails. Also measured here: what a
status write does to a policy with a v1alpha1 writer while the conversion
webhook is down (docs/api-versions.md says it).

An apiserver of its own (no operator: its writes would re-encode the
objects and hide whether the migration wrote anything), its CRD converting
through a ConversionServer."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_helpers import policy, wait_for
from kubernetes import client, config
from operator_process import repo_root
from tests.docs.blocks import parse

from ckptdrain.operator.migration import plan, run
from support import apiserver, etcd_keys
from support.apiserver import Cluster
from support.conversion_server import ConversionServer, converting_crds

ALPHA, BETA = "ckptdrain.io/v1alpha1", "ckptdrain.io/v1beta1"
CRD = "checkpointpolicies.ckptdrain.io"
CRD_FILE = repo_root() / "crds" / "checkpointpolicies.yaml"
REFUSER = "refuse-marked-policies"


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[Cluster, ConversionServer]]:
    """An apiserver with the policy CRD, converting, and nothing writing."""
    with apiserver.running(tmp_path_factory.mktemp("rewrite-apiserver")) as running, \
            converting_crds(running, [CRD_FILE]) as conversion:
        apiserver.wait_established(running, CRD)
        yield running, conversion


def _shipped() -> dict[str, Any]:
    return dict(next(d for d in yaml.safe_load_all(CRD_FILE.read_text()) if d))


def _store_at(cluster: Cluster, conversion: ConversionServer, version: str) -> None:
    """The CRD as shipped, storing `version`, converting; served and stored
    as discovery says before it returns."""
    crd = conversion.converting(_shipped())
    for each in crd["spec"]["versions"]:
        each["storage"] = each["name"] == version
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                    input=json.dumps(crd))
    wanted = plan.storage_version_hash("ckptdrain.io", version, "CheckpointPolicy")

    def discovered() -> bool:
        found = json.loads(cluster.kubectl("get", "--raw", f"/apis/ckptdrain.io/{version}")
                           .stdout)
        return any(r["name"] == "checkpointpolicies" and r.get("storageVersionHash") == wanted
                   for r in found["resources"])
    wait_for(discovered, timeout_s=30, what=f"discovery to show {version} stored")


def _held(cluster: Cluster, namespace: str, name: str) -> str | None:
    held = etcd_keys.stored(cluster, etcd_keys.custom_object_key(
        "ckptdrain.io", "checkpointpolicies", namespace, name))
    return None if held is None else str(held["apiVersion"])


def _stored_versions(cluster: Cluster) -> list[str]:
    crd = json.loads(cluster.kubectl("get", "crd", CRD, "-o", "json").stdout)
    return list(crd["status"]["storedVersions"])


def _policies_at_v1alpha1(cluster: Cluster, conversion: ConversionServer,
                          names: tuple[str, ...], **labels: str) -> str:
    """A new namespace with `names` created at v1alpha1 while v1alpha1 is
    stored, then the CRD flipped to v1beta1: etcd holds them at v1alpha1
    and storedVersions lists both."""
    _store_at(cluster, conversion, "v1alpha1")
    namespace = f"rw-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", namespace)
    for name in names:
        body = policy(name)
        body["metadata"]["labels"] = {**body["metadata"].get("labels", {}), **labels}
        cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(body))
    _store_at(cluster, conversion, "v1beta1")
    # The flip alone rewrites nothing: still v1alpha1 where no one wrote.
    assert {n: _held(cluster, namespace, n) for n in names} == {n: ALPHA for n in names}
    assert sorted(_stored_versions(cluster)) == ["v1alpha1", "v1beta1"]
    return namespace


def _all_policies(cluster: Cluster) -> list[dict[str, Any]]:
    return list(json.loads(cluster.kubectl("get", "checkpointpolicies.v1beta1.ckptdrain.io",
                                           "-A", "-o", "json").stdout)["items"])


def test_the_leaders_pass_writes_each_policy_at_v1beta1_then_trims(
        quiet: tuple[Cluster, ConversionServer], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    cluster, conversion = quiet
    names = ("a", "b")
    namespace = _policies_at_v1alpha1(cluster, conversion, names)
    writers = {n: [(m["manager"], m["apiVersion"]) for m in
                   _all_policies_in(cluster, namespace, n)] for n in names}
    api = config.new_client_from_config(str(cluster.kubeconfig))
    monkeypatch.setattr(run, "_apis", lambda: (client.ApiextensionsV1Api(api),
                                               client.CustomObjectsApi(api)))
    caplog.set_level(logging.INFO, logger=run.__name__)
    everyone = len(_all_policies(cluster))  # earlier tests' policies too
    assert run.migrate_once(0.0, served_since={})

    assert {n: _held(cluster, namespace, n) for n in names} == {n: BETA for n in names}
    assert _stored_versions(cluster) == ["v1beta1"]
    assert f"every object ({everyone}) rewritten at v1beta1" in caplog.text
    # The rewrite changes no field, so no writer's record: each field is
    # still said in the version its writer used (policy/version_messages.py).
    assert {n: [(m["manager"], m["apiVersion"]) for m in
                _all_policies_in(cluster, namespace, n)] for n in names} == writers
    assert ("kubectl-create", ALPHA) in writers["a"]


def _all_policies_in(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    got = json.loads(cluster.kubectl("get", "-n", namespace,
                                     "checkpointpolicies.v1beta1.ckptdrain.io", name,
                                     "--show-managed-fields", "-o", "json").stdout)
    return list(got["metadata"]["managedFields"])


def _by_hand_script() -> str:
    (block,) = [b for b in parse(repo_root() / "docs" / "api-versions.md")
                if b.kind == "cluster" and "storedVersions" in b.text and "patch" in b.text
                and "resourceVersion" in b.text]
    return block.text


def _run_script(cluster: Cluster, script: str) -> subprocess.CompletedProcess[str]:
    """A page's shell block as a user runs it, with this apiserver's kubectl."""
    env = {**cluster.env(), "PATH": f"{Path(cluster.binaries.kubectl).parent}:"
                                    f"{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_documented_by_hand_migration_writes_each_policy_at_v1beta1(
        quiet: tuple[Cluster, ConversionServer]) -> None:
    cluster, conversion = quiet
    names = ("c", "d")
    namespace = _policies_at_v1alpha1(cluster, conversion, names)
    done = _run_script(cluster, _by_hand_script())
    assert done.returncode == 0, done.stdout + done.stderr
    assert {n: _held(cluster, namespace, n) for n in names} == {n: BETA for n in names}
    assert _stored_versions(cluster) == ["v1beta1"]


def test_the_by_hand_migration_leaves_stored_versions_when_a_rewrite_fails(
        quiet: tuple[Cluster, ConversionServer]) -> None:
    cluster, conversion = quiet
    namespace = _policies_at_v1alpha1(cluster, conversion, ("e",))
    refused = _policies_at_v1alpha1(cluster, conversion, ("f",), refuse="yes")
    # A validating webhook nobody answers, failing closed, on updates of
    # the marked policy: its rewrite fails as with a webhook that is down.
    cluster.kubectl("apply", "-f", "-", input=json.dumps(_refusing_webhook()))
    try:
        done = _run_script(cluster, _by_hand_script())
    finally:
        cluster.kubectl("delete", "validatingwebhookconfiguration", REFUSER)
    assert done.returncode != 0
    assert f"not rewritten: {refused}/f" in done.stderr
    assert "storedVersions left as it is" in done.stderr
    assert sorted(_stored_versions(cluster)) == ["v1alpha1", "v1beta1"]
    assert (_held(cluster, namespace, "e"), _held(cluster, refused, "f")) == (BETA, ALPHA)
    # Once the cause is gone, the same script finishes.
    again = _run_script(cluster, _by_hand_script())
    assert again.returncode == 0, again.stderr
    assert _held(cluster, refused, "f") == BETA and _stored_versions(cluster) == ["v1beta1"]


def _refusing_webhook() -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration", "metadata": {"name": REFUSER},
            "webhooks": [{
                "name": "refuse.ckptdrain.io", "admissionReviewVersions": ["v1"],
                "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 2,
                "clientConfig": {"url": "https://127.0.0.1:9/refuse"},
                "objectSelector": {"matchLabels": {"refuse": "yes"}},
                "rules": [{"apiGroups": ["ckptdrain.io"], "apiVersions": ["*"],
                           "operations": ["UPDATE"], "resources": ["checkpointpolicies"]}]}]}


def test_a_status_write_while_conversion_is_down_lands_and_wipes_managed_fields(
        quiet: tuple[Cluster, ConversionServer]) -> None:
    """A status patch at v1beta1 (the operator's) to a policy a user wrote
    at v1alpha1, while /convert does not answer: the apiserver converts for
    the v1alpha1 manager's record, fails, keeps the write and drops every
    managedFields entry (docs/api-versions.md says so)."""
    cluster, conversion = quiet
    _store_at(cluster, conversion, "v1beta1")
    namespace = f"rw-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(policy("g")))
    _write_phase(cluster, namespace, "Ready")  # with /convert up: records kept
    assert ("kubectl-create", ALPHA) in [(m["manager"], m["apiVersion"])
                                         for m in _all_policies_in(cluster, namespace, "g")]
    dead = conversion.converting(_shipped())
    dead["spec"]["conversion"]["webhook"]["clientConfig"]["url"] = "https://127.0.0.1:9/convert"
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                    input=json.dumps(dead))
    try:
        _write_phase(cluster, namespace, "Stalled")
    finally:
        _store_at(cluster, conversion, "v1beta1")
    got = json.loads(cluster.kubectl("get", "-n", namespace,
                                     "checkpointpolicies.v1beta1.ckptdrain.io", "g",
                                     "--show-managed-fields", "-o", "json").stdout)
    assert got["status"]["phase"] == "Stalled"  # the write landed
    assert "managedFields" not in got["metadata"]  # every writer's record gone


def _write_phase(cluster: Cluster, namespace: str, phase: str) -> None:
    cluster.kubectl("patch", "-n", namespace, "checkpointpolicies.v1beta1.ckptdrain.io", "g",
                    "--subresource=status", "--type=merge", "-p",
                    json.dumps({"status": {"phase": phase}}))
