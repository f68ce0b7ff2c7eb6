"""Every Kubernetes object the docs show is accepted by a real kube-apiserver
with the chart's CRDs (schema, defaults and CEL rules) in a server-side dry
run, in the namespace the page applies it to: each manifest under
docs/examples, with the edits a page makes to it (sed), and every YAML block
of whole objects in README.md and docs/."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from tests.docs import blocks, pages
from tests.docs.blocks import REPO
from tests.support.apiserver import Cluster

pytestmark = pytest.mark.cluster

#: Where a manifest without a namespace goes when no page names one.
DEFAULT_NAMESPACE = "docs-examples"


def documented_objects() -> dict[str, list[dict[str, Any]]]:
    """label -> objects, each with the namespace it is documented with."""
    found: dict[str, list[dict[str, Any]]] = {}
    applied = set()
    for page in pages.pages():
        for a in page.applied:
            applied.add(a.file)
            found[f"{a.file.relative_to(REPO)} ({page.path.name})"] = a.objects()
    for path in sorted((REPO / "docs" / "examples").rglob("*.yaml")):
        if path in applied or path.name.startswith("values"):
            continue
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        for d in docs:
            d.setdefault("metadata", {}).setdefault("namespace", DEFAULT_NAMESPACE)
        found[str(path.relative_to(REPO))] = docs
    for block in blocks.all_blocks():
        if block.lang == "yaml" and block.kind == "":
            found[block.id] = [d for d in yaml.safe_load_all(block.text) if d]
    return found


OBJECTS = documented_objects()


@pytest.fixture(scope="module")
def namespaces(cluster: Cluster) -> None:
    names = {DEFAULT_NAMESPACE} | {d["metadata"]["namespace"] for docs in OBJECTS.values()
                                   for d in docs if d["metadata"].get("namespace")}
    for ns in sorted(names):
        cluster.kubectl("create", "namespace", ns, check=False)


def test_the_examples_were_found() -> None:
    labels = " ".join(OBJECTS)
    for name in ("quickstart/job.yaml", "quickstart/policy.yaml", "quickstart/s3.yaml",
                 "policy-eks-s3.yaml", "policy-gke-gcs.yaml", "policy-onprem-minio.yaml",
                 "job-trainer.yaml"):
        assert name in labels, labels


@pytest.mark.parametrize("label", sorted(OBJECTS))
def test_the_apiserver_accepts(cluster: Cluster, namespaces: None, label: str) -> None:
    for obj in OBJECTS[label]:
        result = cluster.kubectl("apply", "--dry-run=server", "-f", "-",
                                 input=json.dumps(obj), check=False)
        assert result.returncode == 0, (
            f"{label}: {obj['kind']} {obj['metadata'].get('name')}: {result.stderr}")


def test_the_dry_run_refuses_a_broken_example(cluster: Cluster, namespaces: None) -> None:
    """A dry run that accepted anything would pass every example."""
    (obj,) = OBJECTS[next(k for k in OBJECTS if k.startswith("docs/examples/quickstart/policy"))]
    broken = json.loads(json.dumps(obj))
    broken["spec"]["interval"] = {"minutes": 10}
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(broken),
                             check=False)
    assert result.returncode != 0 and "interval" in result.stderr, result.stderr
