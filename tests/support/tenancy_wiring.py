"""The apiserver of the class-tenancy wiring tests, replaced: each
namespace's labels (a namespace missing answers 403), its policies, the
namespaces read and the passes scheduled. Shared by
tests/unit/opcore/test_op_class_tenancy_wiring.py and test_op_label_sweep.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from ckptdrain.operator import config
from ckptdrain.operator.apiserver import class_view, namespace_labels
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.bandwidth import rebalance

LOG = logging.getLogger("test")
CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0",
                            cluster_bandwidth=100e6)
TEAM_A = {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
          "metadata": {"name": "team-a", "creationTimestamp": "2026-11-01T00:00:00Z",
                       "annotations": {"ckptdrain.io/is-default-class": "true"}},
          "spec": {"nodeTier": {"root": "/mnt/ckptdrain"},
                   "namespaces": {"from": "Selector",
                                  "selector": {"matchLabels": {"tenant": "a"}}}}}


def policy(namespace: str = "ml", name: str = "llama", cls: str | None = "team-a"
           ) -> dict[str, Any]:
    spec: dict[str, Any] = {"checkpointClassName": cls} if cls else {}
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "generation": 1},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "model": {"checkpointBytes": "900GB"}, "interval": "15m",
                     "localTier": {"path": "/mnt/ckptdrain/nvme"},
                     "storage": {"uri": "s3://bucket/prefix"}, **spec}}


def fake_cluster(monkeypatch: pytest.MonkeyPatch, no_checkpoint_classes: class_view.ClassView
                 ) -> Iterator[dict[str, Any]]:
    """Each namespace's labels (a namespace missing answers 403: the RBAC
    rolled back), the namespace's policies, and the namespaces read."""
    state: dict[str, Any] = {"labels": {"ml": {"tenant": "a"}}, "policies": [], "read": [],
                             "scheduled": []}
    no_checkpoint_classes.replace([TEAM_A], "1")

    def get_json(path: str, query: Any, timeout: float) -> dict[str, Any]:
        namespace = path.rsplit("/", 1)[1]
        state["read"].append(namespace)
        if namespace not in state["labels"]:
            raise apiserver_reads.ApiError(403, "Forbidden")
        return {"metadata": {"name": namespace, "labels": dict(state["labels"][namespace])}}

    monkeypatch.setattr(apiserver_reads, "get_json", get_json)
    monkeypatch.setattr(apiserver_reads, "list_policies",
                        lambda namespace, timeout=5: list(state["policies"]))
    monkeypatch.setattr(apiserver_reads, "first_injected_pod", lambda *a, **k: None)
    monkeypatch.setattr(apiserver_reads, "live_writers",
                        lambda namespace, name, rank, cached=False: [])
    monkeypatch.setattr(rebalance, "schedule", lambda key, cfg, policies, pods, logger,
                        delay=rebalance.REBALANCE_DELAY_S: state["scheduled"].append((key, delay)))
    monkeypatch.setattr(rebalance, "_joint_labels", namespace_labels.version())
    namespace_labels.forget()
    yield state
    namespace_labels.forget()
