"""A pod whose own containers mount a volume ckptdrain injects is refused:
`ckptdrain-local` mounted without the webhook's subPath would be every
writer's local tier and work dir on the node (admission/own_mounts.py)."""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any

import pytest
from test_op_csi_injection import CSI, HOSTPATH, restricted_pod

from ckptdrain.operator import config
from ckptdrain.operator.admission import rules as admission

SPEC = {"selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "80GB"},
        "interval": "15m", "writers": 1,
        "localTier": {"path": "/mnt/ckptdrain/nvme", "keep": 2},
        "storage": {"uri": "s3://bucket/runs"}}


def admit(pod: dict[str, Any], cfg: config.OperatorConfig) -> list[dict[str, Any]]:
    body = copy.deepcopy(pod)
    body["spec"]["terminationGracePeriodSeconds"] = 3600
    body["spec"]["securityContext"]["fsGroup"] = 2000
    candidates = [{"metadata": {"name": "llama", "namespace": "ml", "uid": "u"}, "spec": SPEC}]
    return asyncio.run(admission.admit_pod(body, "ml", cfg, [], logging.getLogger("t"),
                                           candidates, lambda name: lambda rank: [],
                                           every=candidates))


@pytest.mark.parametrize("cfg", [CSI, HOSTPATH], ids=["csi", "hostpath"])
@pytest.mark.parametrize(("kind", "volume", "path"), [
    ("containers", "ckptdrain-local", "/ckptdrain/work"),
    ("containers", "ckptdrain-local", "/data"),
    ("initContainers", "ckptdrain-tmp", "/scratch"),
    ("containers", "ckptdrain-share", "/share")])
def test_a_pod_mounting_an_injected_volume_itself_is_refused(
        cfg: config.OperatorConfig, kind: str, volume: str, path: str) -> None:
    pod = restricted_pod()
    pod["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    container = {"name": "c", "image": "t:1",
                 "volumeMounts": [{"name": "data", "mountPath": "/d"},
                                  {"name": volume, "mountPath": path}]}
    if kind == "containers":
        pod["spec"]["containers"][0]["volumeMounts"] = container["volumeMounts"]
    else:
        pod["spec"]["initContainers"] = [container]
    with pytest.raises(admission.Refused) as refused:
        admit(pod, cfg)
    assert refused.value.code == 422
    message = str(refused.value)
    assert f"spec.{kind}[0].volumeMounts[1]: mounts the volume {volume}" in message
    assert "expected no mount of " in message and "ckptdrain-local" in message


@pytest.mark.parametrize("cfg", [CSI, HOSTPATH], ids=["csi", "hostpath"])
def test_a_pod_mounting_only_its_own_volumes_is_injected(cfg: config.OperatorConfig) -> None:
    pod = restricted_pod()
    pod["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/d"}]
    assert admit(pod, cfg)
