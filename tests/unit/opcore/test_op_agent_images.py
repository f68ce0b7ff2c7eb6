"""Agent image pinning through admission (admission/agent_images.py): the
choice reaches every injected container, the record is read and written as
promised, and a failed read never turns pinning off."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import threading
from datetime import UTC, datetime
from typing import Any

import jsonpatch
import pytest
from kubernetes.client.exceptions import ApiException
from test_op_holder_mirror import _policy, _review, pinned_writer

from ckptdrain.operator import config
from ckptdrain.operator.admission import agent_images
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission.holder_mirror import HolderMirror
from ckptdrain.operator.admission.policy_mirror import PolicyMirror
from ckptdrain.operator.apiserver import reads as apiserver_reads

OLD, NEW = "ckptdrain:1", "ckptdrain:2"
CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image=NEW,
                            agent_images="ckptdrain/agent-images")
AT = datetime(2026, 11, 29, tzinfo=UTC)


def record(*images: str) -> dict[str, Any]:
    data: dict[str, str] | None = None
    for image in images:
        data = agent_images.with_image(data, image, AT, node_tier=CFG.node_tier) or data
    return {"metadata": {"name": "agent-images"}, "data": data or {}}


class Api:
    """The apiserver as admission reads it: the record, the writers of the
    watch cache, a rank's holders (none)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, stored: dict[str, Any]) -> None:
        self.stored, self.pods, self.failing = stored, [], False
        self.reads: list[str] = []
        monkeypatch.setattr(apiserver_reads, "get_json", self.get_json)
        monkeypatch.setattr(apiserver_reads, "live_writers", lambda *a, **k: [])
        monkeypatch.setattr(apiserver_reads, "read_object",
                            lambda *ref: {"spec": {"completions": 2}})
        monkeypatch.setattr(apiserver_reads, "list_policies", lambda namespace: [])

    def get_json(self, path: str, query: Any, timeout: float) -> dict[str, Any]:
        self.reads.append(path)
        if self.failing:
            raise apiserver_reads.ApiError(500, "Internal Server Error")
        if path.endswith("/configmaps/agent-images"):
            return self.stored
        assert path == "/api/v1/namespaces/ml/pods", path
        return {"items": self.pods}


def _reviewer(api: Api, *writers: dict[str, Any], listed: bool = True
              ) -> admission_process.Reviewer:
    policies = PolicyMirror()
    policies.replace([_policy()], "1")
    view = HolderMirror()
    if listed:
        view.replace(list(writers), "1")
    allowed = agent_images.AllowedImages(CFG)
    allowed.read()
    return admission_process.Reviewer(CFG, policies, None, view, allowed)


def _admitted(reviewer: admission_process.Reviewer, index: int) -> tuple[dict[str, Any],
                                                                          list[str]]:
    review = _review(index)
    answer = asyncio.run(reviewer(review, admission.MUTATE_ID))["response"]
    assert answer["allowed"] is True, answer
    pod = jsonpatch.apply_patch(review["request"]["object"],
                                json.loads(base64.b64decode(answer["patch"])))
    return pod, answer.get("warnings", [])


def _images(pod: dict[str, Any]) -> dict[str, str]:
    spec = pod["spec"]
    return {c["name"]: c["image"] for c in [*spec.get("initContainers", []),
                                             *spec["containers"]] if c["name"] != "trainer"}


def _sibling(name: str, rank: int, image: str) -> dict[str, Any]:
    pod = pinned_writer(name, rank, image)
    pod["metadata"]["ownerReferences"][0]["uid"] = "j-1"  # _review's Job
    return pod


def test_a_replacement_gets_its_jobs_image_in_every_injected_container(
        monkeypatch: pytest.MonkeyPatch) -> None:
    api = Api(monkeypatch, record(OLD, NEW))
    pod, warnings = _admitted(_reviewer(api, _sibling("w-0", 0, OLD)), 1)
    images = _images(pod)
    assert set(images) >= {"ckptdrain-agent", "ckptdrain-restore", "ckptdrain-prepare"}
    assert set(images.values()) == {OLD}
    assert pod["metadata"]["annotations"]["ckptdrain.io/agent-image"] == OLD
    assert any(f"agent image {OLD} kept" in w for w in warnings), warnings
    assert not [p for p in api.reads if p.endswith("/pods")]  # the view answered


def test_without_a_view_the_watch_cache_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    api = Api(monkeypatch, record(OLD, NEW))
    api.pods = [_sibling("w-0", 0, OLD), pinned_writer("x-0", 0, OLD)]  # x-0: another Job
    pod, _ = _admitted(_reviewer(api, listed=False), 1)
    assert set(_images(pod).values()) == {OLD}
    api.pods = [pinned_writer("x-0", 0, OLD)]
    pod, _ = _admitted(_reviewer(api, listed=False), 1)
    assert set(_images(pod).values()) == {NEW}


def test_a_failed_read_of_the_record_keeps_what_was_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    api = Api(monkeypatch, record(OLD, NEW))
    allowed = agent_images.AllowedImages(CFG)
    assert allowed.images() is None
    allowed.read()
    api.failing = True
    with pytest.raises(apiserver_reads.ApiError):
        allowed.read()
    assert allowed.images() == (OLD, NEW)
    api.failing = False
    api.stored = {"metadata": {}, "data": {agent_images.KEY: "edited by hand"}}
    allowed.read()
    assert allowed.images() == ()  # unreadable: nothing but the operator's own


def test_only_writers_with_a_generation_are_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    api = Api(monkeypatch, record(OLD, NEW))
    allowed = agent_images.AllowedImages(CFG)
    allowed.read()
    pinning = agent_images.Pinning(allowed, lambda *key: {OLD: 3})

    def image(pod: dict[str, Any], writer: bool = True, cfg: Any = CFG) -> str:
        return asyncio.run(agent_images.image_for(pod, "ml", "llama", writer, cfg,
                                                  pinning)).image

    pod = _review(1)["request"]["object"]
    assert image(pod) == OLD
    assert image(pod, writer=False) == NEW  # a reader
    bare = {**pod, "metadata": {**pod["metadata"], "ownerReferences": []}}
    assert image(bare) == NEW
    opted_out = {**pod, "metadata": {**pod["metadata"], "annotations": {
        **pod["metadata"]["annotations"], "ckptdrain.io/agent-image-pin": "false"}}}
    assert image(opted_out) == NEW
    assert image(pod, cfg=dataclasses.replace(CFG, agent_images="")) == NEW  # pinning off
    api.failing = True  # the view answers: nothing is read
    assert image(pod) == OLD


def test_a_failed_read_of_the_live_writers_gives_the_operators_image_and_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    api = Api(monkeypatch, record(OLD, NEW))
    allowed = agent_images.AllowedImages(CFG)
    allowed.read()
    api.failing = True
    choice = asyncio.run(agent_images.image_for(_review(1)["request"]["object"], "ml",
                                                "llama", True, CFG,
                                                agent_images.Pinning(allowed)))
    assert choice.image == NEW and choice.note is not None
    assert "could not read the live writers" in choice.note


class Core:
    """CoreV1Api's ConfigMap calls, with a conflict on demand."""

    def __init__(self, stored: dict[str, str] | None) -> None:
        self.stored, self.conflicts, self.writes = stored, 0, 0

    def read_namespaced_config_map(self, name: str, namespace: str) -> Any:
        if self.stored is None:
            raise ApiException(status=404)
        return type("ConfigMap", (), {"data": dict(self.stored)})()

    def _write(self, data: dict[str, str]) -> None:
        if self.conflicts:
            self.conflicts -= 1
            raise ApiException(status=409)
        self.writes += 1
        self.stored = data

    def create_namespaced_config_map(self, namespace: str, body: dict[str, Any]) -> None:
        self._write(body["data"])

    def replace_namespaced_config_map(self, name: str, namespace: str, body: Any) -> None:
        self._write(body.data)


def test_recording_retries_a_conflict_and_never_overwrites_a_hand_edit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptdrain.operator.apiserver import kube

    core = Core(None)
    monkeypatch.setattr(kube, "_clients", lambda: (core, None))
    monkeypatch.setattr(agent_images, "RECORD_RETRY_S", (0.0,))
    core.conflicts = 1  # another replica created it first
    assert agent_images.record(CFG, threading.Event())
    assert agent_images.recorded(core.stored, node_tier=CFG.node_tier) == (NEW,)
    assert core.writes == 1
    stored = json.loads(core.stored[agent_images.KEY])["images"]
    assert [e["nodeTier"] for e in stored] == [CFG.node_tier]
    assert agent_images.record(CFG, threading.Event())
    assert core.writes == 1  # the newest already: nothing written
    core.stored = {agent_images.KEY: "edited by hand"}
    assert not agent_images.record(CFG, threading.Event())
    assert core.stored == {agent_images.KEY: "edited by hand"}
    # Deleted, and not ours to make again: said once, not tried every minute.
    core.stored = None
    monkeypatch.setattr(core, "create_namespaced_config_map",
                        lambda *a: (_ for _ in ()).throw(ApiException(status=403)))
    assert not agent_images.record(CFG, threading.Event())


def test_admission_reads_only_the_images_recorded_in_its_node_tier_mode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stored = record(OLD)  # recorded by an operator of the hostPath mode
    Api(monkeypatch, stored)
    on_hostpath = agent_images.AllowedImages(CFG)
    on_hostpath.read()
    assert on_hostpath.images() == (OLD,)
    on_csi = agent_images.AllowedImages(
        dataclasses.replace(CFG, node_tier=config.NODE_TIER_CSI))
    on_csi.read()
    assert on_csi.images() == ()
