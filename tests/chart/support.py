"""Paths, the tool runner and the rendering helpers shared by the chart tests."""

from __future__ import annotations

import io
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "ckptdrain"
CRDS = REPO / "crds"
CACHE = Path(os.environ.get("CKPTDRAIN_CACHE", Path.home() / ".cache" / "ckptdrain"))
TOOLS = CACHE / "tools" / "bin"
EXAMPLES = REPO / "docs" / "examples"
#: The documented values files for cloud clusters (docs/examples/values-*.yaml).
CLOUD_VALUES = sorted(EXAMPLES.glob("values-*.yaml"))


@dataclass(frozen=True)
class Tools:
    helm: Path
    kubeconform: Path

    def run(self, tool: str, *args: str, env: dict[str, str] | None = None,
            input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run helm or kubeconform; on an unexpected failure, show its output."""
        result = subprocess.run([str(getattr(self, tool)), *args], text=True, input=input,
                                capture_output=True, env=env, timeout=300)
        if check and result.returncode != 0:
            pytest.fail(f"{tool} {' '.join(args)} failed ({result.returncode}):\n"
                        f"{result.stdout}\n{result.stderr}")
        return result


def render(tools: Tools, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart as release ckptdrain in namespace ckptdrain."""
    return tools.run("helm", "template", "ckptdrain", str(CHART), "--namespace", "ckptdrain",
                     *args, check=check)


def documents(text: str) -> list[dict]:
    """The objects of a multi-document YAML stream, empty documents left out."""
    return [d for d in yaml.safe_load_all(io.StringIO(text)) if d]


def adopt_crds(cluster: Any, release: str, namespace: str) -> None:
    """Mark CRDs applied by hand as the release's, as docs/install.md tells an
    installation made before the CRDs were templated to do once."""
    # Tests apply every CRD in crds/ by hand, CheckpointClass too (an older
    # installation had none: the chart creates it).
    for crd in ("checkpointclasses.ckptdrain.io", "checkpointpolicies.ckptdrain.io",
                "checkpoints.ckptdrain.io", "checkpointshares.ckptdrain.io"):
        cluster.kubectl("label", "--overwrite", "crd", crd, "app.kubernetes.io/managed-by=Helm")
        cluster.kubectl("annotate", "--overwrite", "crd", crd,
                        f"meta.helm.sh/release-name={release}",
                        f"meta.helm.sh/release-namespace={namespace}")
