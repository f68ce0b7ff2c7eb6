"""Every fenced code block of the README and docs/ runs or is checked, as its
marker says (tests/docs/blocks.py), so that a page that drifts from the code
fails here: python and shell blocks run in a scratch directory with this
checkout's `ckptdrain`, the S3 ones against a real SeaweedFS, policy and
values fragments go through the operator's checks and the chart's schema."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.chart.support import CHART
from tests.docs import blocks, gitops
from tests.docs.blocks import REPO, Block
from tests.docs.conftest import (
    config_from_env,
    default_config,
    render,
    v1beta1_policy_problems,
)
from tests.support.s3servers import start_seaweedfs

BLOCKS = blocks.all_blocks()
#: A fragment of a policy is checked inside this whole one (the quickstart's).
BASE_POLICY = REPO / "docs" / "examples" / "quickstart" / "policy.yaml"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This interpreter's bin directory first on PATH (its `ckptdrain`), this
    checkout's sources importable, a work dir as a pod has one."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "operator"), str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["CKPTDRAIN_WORK_DIR"] = str(tmp_path / "work")
    for name in [k for k in env if k.startswith("AWS_")]:
        del env[name]
    env.update(extra)
    return env


def _run(argv: list[str], tmp_path: Path, env: dict[str, str]) -> None:
    result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, (
        f"exit {result.returncode}\n--- stdout\n{result.stdout[-3000:]}\n"
        f"--- stderr\n{result.stderr[-3000:]}")


def _merge(base: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in part.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(
            out.get(key), dict) else value
    return out


def _ruff() -> str:
    found = Path(sys.executable).parent / "ruff"
    return str(found) if found.exists() else shutil.which("ruff") or "ruff"


def check_python_unrun(block: Block, tmp_path: Path) -> None:
    """Compiles, and names nothing undefined but what the text leaves to the reader."""
    compile(block.text, block.id, "exec")
    script = tmp_path / "block.py"
    script.write_text(block.text)
    builtins = json.dumps(block.given())
    result = subprocess.run([_ruff(), "check", "--isolated", "--select", "F", "--config",
                             f"builtins = {builtins}", "--output-format", "concise",
                             str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def check_cluster(block: Block, tmp_path: Path) -> None:
    """Not run: valid shell, and every repository file it names exists."""
    _run(["bash", "-n", "-c", block.text], tmp_path, _env(tmp_path))
    for path in re.findall(r"(?<![\w/.$])((?:docs|charts|e2e|crds)/[\w./-]+)", block.text):
        assert (REPO / path).exists(), f"{block.id} names {path}, which does not exist"


def run_s3(block: Block, tmp_path: Path) -> None:
    with start_seaweedfs(tmp_path / "server") as server:
        for bucket in sorted(set(re.findall(r"s3://([a-z0-9][a-z0-9.-]+)", block.text))):
            server.create_bucket(bucket)
        env = _env(tmp_path, AWS_ENDPOINT_URL=server.endpoint_url,
                   AWS_ACCESS_KEY_ID=server.access_key, AWS_SECRET_ACCESS_KEY=server.secret_key,
                   AWS_REGION=server.region)
        _run(["bash", "-euo", "pipefail", "-c", block.text], tmp_path, env)


def check_fragment(block: Block, tmp_path: Path) -> None:
    what = block.note.split()[0] if block.note else ""
    if what == "gitops":  # several objects
        check_gitops(block, tmp_path)
        return
    if what == "kueue":  # several objects, applied by e2e/scenario/kueue.py
        check_kueue(block)
        return
    doc = json.loads(block.text) if block.lang == "json" else yaml.safe_load(block.text)
    assert doc, f"{block.id}: empty"
    if what == "policy":
        base = yaml.safe_load(BASE_POLICY.read_text())["spec"]
        # Only the URI of its store: a fragment brings the rest of its own.
        base["storage"] = {"uri": base["storage"]["uri"]}
        spec = _merge(base, doc.get("spec", doc))
        # The quickstart's policy is v1beta1, what users write: so is each
        # fragment, stored as the apiserver stores it.
        assert v1beta1_policy_problems(spec, default_config(), "fragment") == [], block.id
    elif what == "values":
        values = tmp_path / "values.yaml"
        values.write_text(block.text)
        rendered = render(["-f", str(values)])
        # What the operator checks at start beyond the chart's schema.
        deployment = next(d for d in rendered if d["kind"] == "Deployment")
        env = {e["name"]: e["value"] for e in
               deployment["spec"]["template"]["spec"]["containers"][0]["env"]
               if e["name"] in ("CKPTDRAIN_CONTAINERS", "CKPTDRAIN_AGENT_IDENTITIES")}
        config_from_env(env)


def check_kueue(block: Block) -> None:
    """Kueue's objects (docs/kueue.md): no Kueue CRDs here to dry-run them
    against; the e2e applies them to the real Kueue. Each is a named object
    of Kueue's served version, and the queues name each other."""
    docs = [d for d in yaml.safe_load_all(block.text) if d]
    assert docs, f"{block.id}: empty"
    for doc in docs:
        assert doc.get("apiVersion") == "kueue.x-k8s.io/v1beta1" and doc.get("kind") and (
            doc.get("metadata") or {}).get("name"), f"{block.id}: not a named Kueue object: {doc}"
    named = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for doc in docs:
        if doc["kind"] == "LocalQueue":
            assert ("ClusterQueue", doc["spec"]["clusterQueue"]) in named, block.id
        for group in (doc.get("spec") or {}).get("resourceGroups") or []:
            for flavor in group["flavors"]:
                assert ("ResourceFlavor", flavor["name"]) in named, block.id


def check_gitops(block: Block, tmp_path: Path) -> None:
    """Argo CD and Flux objects (tests/docs/gitops.py): each installs this
    chart, with values that values.schema.json names and that render, and
    what Argo CD is told to ignore is in that render."""
    try:
        found = gitops.releases([d for d in yaml.safe_load_all(block.text) if d])
    except (ValueError, KeyError) as e:
        pytest.fail(f"{block.id}: {e!r}")
    assert found, f"{block.id}: no Application or HelmRelease"
    name = yaml.safe_load((CHART / "Chart.yaml").read_text())["name"]
    schema = json.loads((CHART / "values.schema.json").read_text())
    for release in found:
        assert release.chart in (name, str(CHART.relative_to(REPO))), (
            f"{block.id}: {release.source} installs {release.chart!r}")
        unknown = gitops.unknown_values(release.values, schema)
        assert unknown == [], f"{block.id}: {release.source}: no such values {unknown}"
        values = tmp_path / "values.yaml"
        values.write_text(yaml.safe_dump(release.values))
        objects = render(["-f", str(values)], release=release.release_name)
        for ignored in release.ignored:
            assert any(o["kind"] == ignored["kind"]
                       and o["apiVersion"].rpartition("/")[0] == ignored.get("group", "")
                       and ignored.get("name", o["metadata"]["name"]) == o["metadata"]["name"]
                       for o in objects), f"{block.id}: {release.source} ignores {ignored}, " \
                                          "which the chart does not render"


def check_objects(block: Block) -> None:
    """A YAML block of whole Kubernetes objects (applied by test_examples.py)."""
    for doc in yaml.safe_load_all(block.text):
        assert doc and "apiVersion" in doc and "kind" in doc, (
            f"{block.id}: not a whole Kubernetes object; mark a fragment "
            "`<!-- docs-test: fragment ... -->`")


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block(block: Block, tmp_path: Path) -> None:
    lang = "sh" if block.lang == "bash" else block.lang
    if block.kind == "fragment":
        assert lang in ("yaml", "json"), f"{block.id}: a fragment must be YAML or JSON"
        check_fragment(block, tmp_path)
    elif block.kind == "skip":
        assert block.note, f"{block.id}: say why it cannot run (docs-test: skip REASON)"
        if lang == "python":
            check_python_unrun(block, tmp_path)
        elif lang == "sh":
            _run(["bash", "-n", "-c", block.text], tmp_path, _env(tmp_path))
    elif block.kind == "cluster":
        assert lang == "sh", f"{block.id}: cluster blocks are shell"
        check_cluster(block, tmp_path)
    elif block.kind == "s3":
        assert lang == "sh", f"{block.id}: s3 blocks are shell"
        run_s3(block, tmp_path)
    elif lang == "python":
        script = tmp_path / "block.py"
        script.write_text(block.text)
        _run([sys.executable, str(script)], tmp_path, _env(tmp_path))
    elif lang == "sh":
        _run(["bash", "-euo", "pipefail", "-c", block.text], tmp_path, _env(tmp_path))
    elif lang == "yaml":
        check_objects(block)
    elif lang == "json":
        json.loads(block.text)
    else:
        pytest.fail(f"{block.id}: no runner for a {block.lang} block; mark it "
                    "(docs-test: skip REASON)")


def test_the_runner_finds_the_blocks_it_must_run() -> None:
    """A parser that lost blocks would pass every page."""
    by_kind = {k: [b for b in BLOCKS if b.kind == k] for k in ("", "s3", "cluster", "skip")}
    assert any(b.path.name == "README.md" and b.lang == "python" for b in by_kind[""])
    assert any(b.path.name == "README.md" for b in by_kind["s3"])
    assert any(b.path.name == "quickstart.md" for b in by_kind["cluster"])
    assert len(by_kind["skip"]) <= 6, [b.id for b in by_kind["skip"]]


def test_an_unmarked_block_that_cannot_run_fails(tmp_path: Path) -> None:
    """The runner fails a block it cannot run, rather than passing it."""
    page = tmp_path / "page.md"
    page.write_text("text\n\n```sh\nckptdrain-no-such-tool install x\n```\n\n"
                    "```text\nnot code\n```\n")
    sh, text = blocks.parse(page)
    with pytest.raises(AssertionError, match="exit 127"):
        test_block(sh, tmp_path)
    with pytest.raises(pytest.fail.Exception):
        test_block(text, tmp_path)


def test_a_marker_with_a_typo_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- docs-test: skp because -->\n```sh\ntrue\n```\n")
    with pytest.raises(ValueError, match="unknown docs-test marker 'skp'"):
        blocks.parse(page)


GITOPS_BLOCKS = {kind: next(b for b in BLOCKS if b.kind == "fragment" and b.note == "gitops"
                            and f"kind: {kind}" in b.text)
                 for kind in ("Application", "HelmRelease")}


@pytest.mark.parametrize(("kind", "old", "new"), [
    ("HelmRelease", "namespaces: [ml-training]", "namespace: [ml-training]"),  # no such key
    ("HelmRelease", "crds: Skip", "crds: Skipped"),  # not a Flux policy
    ("HelmRelease", "helm.toolkit.fluxcd.io/v2", "helm.toolkit.fluxcd.io/v2beta9"),
    ("HelmRelease", "chart: ckptdrain", "chart: ckptdrain-operator"),  # another chart
    ("Application", "path: charts/ckptdrain", "path: charts/ckptdrain-operator"),
    ("Application", 'tag: "0.3.0"', "tag: 0.2"),  # a number: the schema wants a string
    ("Application", "name: ckptdrain-webhook-cert", "name: ckptdrain-cert"),  # not rendered
])
def test_a_broken_gitops_example_fails(tmp_path: Path, kind: str, old: str, new: str) -> None:
    """The docs' Application or HelmRelease, with one mistake a reader could copy."""
    block = GITOPS_BLOCKS[kind]
    assert old in block.text
    broken = Block(block.path, block.line, "yaml", block.text.replace(old, new, 1),
                   "fragment", "gitops")
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        check_fragment(broken, tmp_path)
