"""A CheckpointClass's placement edited: each policy of the class gets a
Warning Event for each live pod whose nodeSelector the class now
contradicts (its replacements may be refused at admission); policies of
other classes, pods being deleted and agreeing pods get none."""

from __future__ import annotations

from typing import Any

import pytest

from ckptdrain.operator import class_events
from ckptdrain.operator.apiserver import class_view
from ckptdrain.operator.policy.allocation import DrainingPod

CLASS = {"metadata": {"name": "fast", "creationTimestamp": "2026-11-01T00:00:00Z"},
         "spec": {"nodeTier": {"root": "/mnt/nvme", "nodeSelector": {"pool": "nvme"}}}}


def policy(name: str, cls: str) -> dict[str, Any]:
    return {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointPolicy",
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
            "spec": {"checkpointClassName": cls}}


def test_each_live_pod_the_edit_strands_is_a_warning_on_its_policy(
        monkeypatch: pytest.MonkeyPatch, no_checkpoint_classes: class_view.ClassView) -> None:
    no_checkpoint_classes.replace([CLASS], "2")
    said: list[tuple[str, str, str]] = []
    monkeypatch.setattr(class_events.kopf, "warn", lambda body, reason, message: said.append(
        (body["metadata"]["name"], reason, message)))
    policies = {("ml", "a"): [policy("a", "fast")], ("ml", "b"): [policy("b", "other")]}
    hdd = (("pool", "hdd"),)
    pods = {("ml", "a"): [DrainingPod("a-0", None, node_selector=hdd),
                          DrainingPod("a-1", None, node_selector=(("pool", "nvme"),)),
                          DrainingPod("a-2", None, deleting=True, node_selector=hdd)],
            ("ml", "b"): [DrainingPod("b-0", None, node_selector=hdd)]}
    class_events._warn_stranded(CLASS, policies, pods)
    assert [(n, r) for n, r, _ in said] == [("a", "PlacementChanged")], said
    assert "pod a-0 has nodeSelector pool=hdd" in said[0][2]
    assert "CheckpointClass fast now gives pool=nvme" in said[0][2]
