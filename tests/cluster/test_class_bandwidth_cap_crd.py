"""CheckpointClass spec.bandwidthCap against a real apiserver: a cap spelled
as a v1beta1 policy's caps.bandwidth is stored as written; zero, negative,
below 1 byte per second, unitless digit strings and units that are no quantity's are refused naming
the field; and the operator's own reading of a class (policy/classes.py)
takes exactly what the apiserver takes, so a class stored before the CRD
said so is refused by the operator alike.

An apiserver of this module's own, with only the class CRD."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from operator_process import repo_root

from ckptdrain.operator.policy import classes
from support import apiserver
from support.apiserver import Cluster

CRD = repo_root() / "crds" / "checkpointclasses.yaml"


def _class(cap: object) -> dict[str, Any]:
    return {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
            "metadata": {"name": "capped"},
            "spec": {"nodeTier": {"root": "/mnt/nvme"}, "bandwidthCap": cap}}


@pytest.fixture(scope="module")
def class_crd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    apiserver.binaries_or_fail()
    with apiserver.running(tmp_path_factory.mktemp("class-cap-apiserver")) as running:
        running.kubectl("apply", "-f", str(CRD))
        running.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                        "crd/checkpointclasses.ckptdrain.io")
        yield running


def _dry_run(cluster: Cluster, body: dict[str, Any]) -> Any:
    return cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                           input=json.dumps(body), check=False)


GOOD: list[object] = [10_000_000_000, 1, "10G", "1.25Gi", "500M", "0.5G", "2.5", "1.0",
                      "0.001k", "800Ki", "1T"]
#: Below 1 B/s refused as the integer 0 is ("0.5", "0.0009k").
BAD: list[object] = [0, -5, "0", "0G", "0.0", "00.00Ki", "0.5", "0.0009k", "10000000000",
                     "-1G", "10GB", "10GB/s", "10g", "1e9", "ten", "", True]


@pytest.mark.parametrize("cap", GOOD, ids=repr)
def test_a_cap_spelled_as_a_policy_caps_bandwidth_is_stored(class_crd: Cluster,
                                                           cap: object) -> None:
    created = _dry_run(class_crd, _class(cap))
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["spec"]["bandwidthCap"] == cap
    assert classes.read(_class(cap)).bandwidth_cap is not None


@pytest.mark.parametrize("cap", BAD, ids=repr)
def test_the_apiserver_and_the_operator_refuse_a_bad_cap_naming_the_field(
        class_crd: Cluster, cap: object) -> None:
    refused = _dry_run(class_crd, _class(cap))
    assert refused.returncode != 0, f"{cap!r} was stored"
    assert "spec.bandwidthCap" in refused.stderr, refused.stderr
    assert "unknown field" not in refused.stderr  # refused for its value, by the schema
    with pytest.raises(classes.ClassInvalid) as invalid:
        classes.read(_class(cap))
    assert [e.field for e in invalid.value.errors] == ["spec.bandwidthCap"]
    assert "above zero" in str(invalid.value)


def test_the_cap_shows_in_kubectl_get(class_crd: Cluster) -> None:
    class_crd.kubectl("apply", "-f", "-", input=json.dumps(_class("10G")))
    try:
        listed = class_crd.kubectl("get", "checkpointclass", "capped").stdout
        header, row = listed.splitlines()[:2]
        assert "CAP" in header.split() and "10G" in row.split()
    finally:
        class_crd.kubectl("delete", "checkpointclass", "capped", "--wait=false")
