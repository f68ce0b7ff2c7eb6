"""Small helpers for the cluster tests: read objects, wait, build manifests."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_process import repo_root

from support.apiserver import Cluster

#: CheckpointPolicies as kubectl names them here: at v1alpha1, the version
#: the operator stores and writes. Named, since an unnamed read asks for the
#: preferred version, v1beta1, made by the conversion webhook, and no
#: Service answers that here (tests/cluster/conversion/ tests
#: conversion on an apiserver of its own, test_chart_upgrade.py through the
#: session's operator).
POLICIES = "checkpointpolicies.v1alpha1.ckptdrain.io"
CLASSES = "checkpointclasses.ckptdrain.io"


def get(cluster: Cluster, namespace: str, *what: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "-n", namespace, *what, "-o", "json")
    return dict(json.loads(out.stdout))


def wait_for(check: Callable[[], Any], timeout_s: float = 30, what: str = "condition") -> Any:
    """Poll until `check()` is truthy; returns its value."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (KeyError, IndexError, TypeError):
            last = None
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last={last!r}")



def admission_answers(kubectl: Callable[..., subprocess.CompletedProcess[str]],
                      namespace: str, body: dict[str, Any], *, admitted: bool,
                      says: str = "") -> None:
    """Wait until the apiserver answers creating `body` in `namespace` as
    a changed webhook configuration says: `admitted`, or refused with `says`
    in its message. The apiserver reads webhook configurations through a
    watch, so one deleted or registered is acted on a moment after it is
    stored; each try is a server-side dry run (nothing is stored), up to
    wait_for's bound on what is coming. `kubectl`: who creates it, called
    as Tenant.kubectl is (`body=`)."""
    def as_said() -> bool:
        made = kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", body=body)
        return (made.returncode == 0) == admitted and says in made.stderr
    wait_for(as_said, what=f"the apiserver to {'admit' if admitted else 'refuse'} "
             f"{body['kind']} {body['metadata']['name']} under the changed webhooks")

def policy(name: str, **spec: Any) -> dict[str, Any]:
    """A valid CheckpointPolicy (405B, 15m, 10%) with `spec` overrides."""
    body: dict[str, Any] = {
        "selector": {"matchLabels": {"app": name}},
        "model": {"parameters": "405B"},
        "interval": "15m",
        "overlap": "10%",
        "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2},
        "storage": {"uri": "s3://ckpt-bucket/runs",
                    "endpoint": "http://minio.storage:9000",
                    "credentialsSecretRef": {"name": "s3-creds"}},
    }
    body.update(spec)
    return {"apiVersion": "ckptdrain.io/v1alpha1", "kind": "CheckpointPolicy",
            "metadata": {"name": name}, "spec": body}


def pod(name: str, labels: dict[str, str], index: int | None = None,
        **spec: Any) -> dict[str, Any]:
    """A pod; with `index`, the completion index an Indexed Job gives it (its
    writer rank under a policy with several writers)."""
    body: dict[str, Any] = {"containers": [{"name": "trainer", "image": "trainer:1"}]}
    body.update(spec)
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if index is not None:
        meta["annotations"] = {JOB_INDEX: str(index)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


INJECT = {"ckptdrain.io/inject": "true"}
JOB_INDEX = "batch.kubernetes.io/job-completion-index"


def owned_by(body: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    """`body` (a pod) with `job` as its controlling owner, as the Job controller sets it."""
    body["metadata"]["ownerReferences"] = [{
        "apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"],
        "uid": job["metadata"]["uid"], "controller": True}]
    return body


def create(cluster: Cluster, namespace: str, body: dict[str, Any]) -> Any:
    """`kubectl create` of `body`, its answer as JSON on stdout; never raises."""
    return cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "json",
                           input=json.dumps(body), check=False)


def indexed_job(cluster: Cluster, namespace: str, name: str, completions: int,
                labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A stored Indexed Job (suspended: nothing here would run it anyway)."""
    body = {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, **({"labels": labels} if labels else {})},
            "spec": {"completionMode": "Indexed", "completions": completions,
                     "parallelism": completions, "suspend": True,
                     "template": {"spec": {"restartPolicy": "Never", "containers": [
                         {"name": "trainer", "image": "trainer:1"}]}}}}
    made = create(cluster, namespace, body)
    assert made.returncode == 0, made.stderr
    return dict(json.loads(made.stdout))


def jobset_over_a_job(cluster: Cluster, namespace: str, name: str, completions: int
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
    """A stored JobSet `name` (served from a minimal CRD: no controller runs
    it) and its Indexed Job `<name>-workers-0`, owned as the JobSet
    controller owns it: the owner reference to the JobSet, and the Job."""
    jobset = create(cluster, namespace, {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": name}, "spec": {"replicatedJobs": []}})
    assert jobset.returncode == 0, jobset.stderr
    owner = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": name,
             "uid": json.loads(jobset.stdout)["metadata"]["uid"], "controller": True}
    job = indexed_job(cluster, namespace, f"{name}-workers-0", completions)
    cluster.kubectl("patch", "-n", namespace, "job", f"{name}-workers-0", "--type=merge", "-p",
                    json.dumps({"metadata": {"ownerReferences": [owner]}}))
    return owner, job


def helm_binary() -> Path:
    """helm from the cache `make servers` fills; missing fails the test."""
    cache = Path(os.environ.get("CKPTDRAIN_CACHE") or Path.home() / ".cache" / "ckptdrain")
    helm = cache / "tools" / "bin" / "helm"
    if not os.access(helm, os.X_OK):
        pytest.fail(f"helm is missing ({helm}): build it once with `make servers`",
                    pytrace=False)
    return helm


def render_chart(release: str, namespace: str, templates: list[str], *values: str) -> str:
    """Chart templates, rendered as `helm install` and `helm template` render
    them (the chart decides by its values alone)."""
    helm = helm_binary()
    shown = [arg for t in templates for arg in ("--show-only", f"templates/{t}")]
    out = subprocess.run([str(helm), "template", release, str(repo_root() / "charts" /
                          "ckptdrain"), "--namespace", namespace, *values, *shown],
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout


def policy_crd_source() -> dict[str, Any]:
    """crds/checkpointpolicies.yaml as shipped: v1beta1 stored, v1alpha1
    served too (converted by the webhook), for tests that change a copy
    (its conversion client, its rules) on an apiserver of their own."""
    crd = dict(yaml.safe_load((repo_root() / "crds" / "checkpointpolicies.yaml").read_text()))
    served = {v["name"]: (v["served"], v["storage"]) for v in crd["spec"]["versions"]}
    assert served == {"v1alpha1": (True, False), "v1beta1": (True, True)}, served
    return crd


def page_object(page: Path, kind: str) -> dict[str, Any]:
    """The one object of `kind` among a docs page's YAML blocks of whole
    objects (a copy: the tests change names), so a test applies what the
    page shows."""
    from tests.docs.blocks import parse

    found = [doc for block in parse(page) if block.lang == "yaml" and block.kind == ""
             for doc in yaml.safe_load_all(block.text) if doc and doc.get("kind") == kind]
    assert len(found) == 1, f"{page.name}: {len(found)} {kind} objects, expected one"
    return dict(json.loads(json.dumps(found[0])))


def csi_driver_rules() -> list[dict[str, Any]]:
    """What the CSI driver's ClusterRole grants, as docs/csi-driver.md documents it."""
    return list(page_object(repo_root() / "docs" / "csi-driver.md", "ClusterRole")["rules"])
