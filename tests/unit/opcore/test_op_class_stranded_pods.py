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


HDD = {**CLASS, "spec": {"nodeTier": {"root": "/mnt/nvme", "nodeSelector": {"pool": "hdd"}}}}
ROOT_ONLY = {**CLASS, "spec": {"nodeTier": {"root": "/mnt/other"}}}


def test_an_edit_of_the_class_selector_warns_each_policy_with_stranded_pods_once(
        monkeypatch: pytest.MonkeyPatch, no_checkpoint_classes: class_view.ClassView) -> None:
    said: list[tuple[str, str, str]] = []
    monkeypatch.setattr(class_events.kopf, "warn", lambda body, reason, message: said.append(
        (body["metadata"]["name"], reason, message)))
    monkeypatch.setattr(class_events, "_selectors_seen", {})
    policies = {("ml", "a"): [policy("a", "fast")], ("ml", "b"): [policy("b", "other")]}
    hdd = (("pool", "hdd"),)
    pods = {("ml", "a"): [DrainingPod("a-0", None, node_selector=hdd),
                          DrainingPod("a-1", None, node_selector=(("pool", "nvme"),)),
                          DrainingPod("a-2", None, deleting=True, node_selector=hdd)],
            ("ml", "b"): [DrainingPod("b-0", None, node_selector=hdd)]}

    def seen(body: dict[str, Any]) -> list[tuple[str, str]]:
        no_checkpoint_classes.replace([body], str(len(said) + 10))
        before = len(said)
        class_events._warn_stranded(body, policies, pods)
        return [(n, r) for n, r, _ in said[before:]]

    # First sight (a start, a new class): the pods were admitted under it.
    assert seen(HDD) == []
    # The selector edited: policy a's live pod a-0 is stranded; b is
    # another class's, a-2 is going, a-1 agrees.
    assert seen(CLASS) == [("a", "PlacementChanged")], said
    assert "1 live pod(s) (a-0) have nodeSelector pool=hdd" in said[-1][2]
    assert "CheckpointClass fast now gives pool=nvme" in said[-1][2]
    # Any other edit or status write of the class: no Event again.
    assert seen(CLASS) == []
    # The selector dropped: nothing can be refused for it.
    assert seen(ROOT_ONLY) == []
