"""The pure core imports nothing from Kubernetes, Kopf or boto: checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PURE = ["ckptdrain.units", "ckptdrain.sizing", "ckptdrain.manifest", "ckptdrain.keys",
        "ckptdrain.paths", "ckptdrain.checksum", "ckptdrain.ratelimit",
        "ckptdrain.transfer.journal", "ckptdrain.flags", "ckptdrain.store.endpoint"]
FORBIDDEN = ("kopf", "kubernetes", "boto3", "botocore", "s3transfer", "aiohttp")


def _loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    return {m.split(".")[0] for m in json.loads(out.stdout.splitlines()[-1])}


@pytest.mark.parametrize("module", PURE)
def test_pure_core_imports_no_cluster_or_cloud_sdk(module: str) -> None:
    loaded = _loaded_after(f"import {module}")
    assert not loaded & set(FORBIDDEN), f"{module} pulls in {sorted(loaded & set(FORBIDDEN))}"


def test_ckptdrain_size_never_imports_kopf_or_boto() -> None:
    code = ("import sys\nfrom ckptdrain import cli\n"
            "rc = cli.main(['size', '--parameters', '405B', '--interval', '15m', '--json'])\n"
            "assert rc == 0")
    loaded = _loaded_after(code)
    assert not loaded & set(FORBIDDEN), sorted(loaded & set(FORBIDDEN))


def test_the_probe_can_fail() -> None:
    assert "boto3" in _loaded_after("import boto3")
