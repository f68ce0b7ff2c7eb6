"""Which agent image a writer gets (admission/agent_pin.py) and the record of
images the operator injected (admission/agent_images.py): pure parts."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import agent_images, agent_pin

NEW, OLD, OLDER = "ckptdrain:2", "ckptdrain:1", "ckptdrain:0"
JOB_UID = "0b1c"


def pod(name: str = "w-1", *, labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        owner: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels or {},
                            "annotations": annotations or {}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta}


def job_pod(name: str = "w-1", uid: str = JOB_UID) -> dict[str, Any]:
    return pod(name, owner={"kind": "Job", "name": "train", "uid": uid, "controller": True})


def test_the_generation_of_each_workload() -> None:
    assert agent_pin.generation(job_pod()) == f"Job/{JOB_UID}"
    jobset = pod(labels={"jobset.sigs.k8s.io/jobset-name": "llm",
                         "jobset.sigs.k8s.io/jobset-uid": "js-1",
                         "jobset.sigs.k8s.io/restart-attempt": "2"},
                 owner={"kind": "Job", "uid": "job-of-one-slice", "controller": True})
    # Every Job of one JobSet attempt is one generation; a restart, or the
    # JobSet applied again (a new uid), is another.
    assert agent_pin.generation(jobset) == "JobSet/llm/js-1/2"
    by_annotation = pod(annotations={"jobset.sigs.k8s.io/jobset-name": "llm",
                                     "jobset.sigs.k8s.io/restart-attempt": "3"})
    assert agent_pin.generation(by_annotation) == "JobSet/llm//3"
    lws = pod(labels={"leaderworkerset.sigs.k8s.io/name": "serve",
                      "leaderworkerset.sigs.k8s.io/template-revision-hash": "abc"},
              owner={"kind": "StatefulSet", "uid": "sts-of-group-1", "controller": True})
    assert agent_pin.generation(lws) == "LeaderWorkerSet/serve/abc"
    # A reference that is not the controller says nothing; a bare pod has none.
    assert agent_pin.generation(pod(owner={"kind": "Job", "uid": "x"})) is None
    assert agent_pin.generation(pod()) is None


def test_a_replacement_keeps_the_image_its_workload_runs() -> None:
    choice = agent_pin.choose(NEW, [OLD, NEW], job_pod(), {OLD: 2})
    assert choice.image == OLD
    assert choice.note is not None and "2 other live writer(s) of this Job" in choice.note


def test_a_first_pod_and_an_unpinned_one_get_the_operators_image() -> None:
    assert agent_pin.choose(NEW, [OLD, NEW], job_pod(), {}) == agent_pin.Choice(NEW)
    assert agent_pin.choose(OLD, [OLD, NEW], job_pod(), {}) == agent_pin.Choice(OLD)
    # A bare pod, or one opted out, is never pinned.
    assert agent_pin.choose(NEW, [OLD, NEW], pod(), {OLD: 3}) == agent_pin.Choice(NEW)
    out = job_pod()
    out["metadata"]["annotations"]["ckptdrain.io/agent-image-pin"] = "false"
    assert agent_pin.choose(NEW, [OLD, NEW], out, {OLD: 3}) == agent_pin.Choice(NEW)


def test_only_pods_the_webhook_injected_say_what_they_run() -> None:
    injected = pod(labels={"ckptdrain.io/inject": "true"},
                   annotations={"ckptdrain.io/injected": "true",
                                "ckptdrain.io/agent-image": OLD})
    assert agent_pin.running_image(injected) == OLD
    never_admitted = pod(annotations={"ckptdrain.io/injected": "true",
                                      "ckptdrain.io/agent-image": OLD})
    assert agent_pin.running_image(never_admitted) is None


def test_an_image_not_recorded_is_never_given_nor_outvotes_a_recorded_one() -> None:
    """A tenant may edit its pods' annotations: only recorded images count."""
    choice = agent_pin.choose(NEW, [OLD, NEW], job_pod(), {"evil:1": 4})
    assert choice.image == NEW
    assert choice.note is not None and "not among the agent images" in choice.note
    assert "evil:1" in choice.note
    assert agent_pin.choose(NEW, [OLD, NEW], job_pod(), {"evil:1": 4, OLD: 3}).image == OLD
    unread = agent_pin.choose(NEW, None, job_pod(), {OLD: 2})
    assert unread.image == NEW and unread.note is not None and "could not be read" in unread.note


def test_the_image_most_live_writers_run_wins_ties_to_the_operators_then_newest() -> None:
    assert agent_pin.choose(NEW, [OLDER, OLD, NEW], job_pod(), {OLD: 2, OLDER: 1}).image == OLD
    assert agent_pin.choose(NEW, [OLD, NEW], job_pod(), {OLD: 1, NEW: 1}) \
        == agent_pin.Choice(NEW)
    assert agent_pin.choose(NEW, [OLDER, OLD, NEW], job_pod(), {OLDER: 1, OLD: 1}).image == OLD


AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
HOSTPATH, CSI = config.NODE_TIER_HOSTPATH, config.NODE_TIER_CSI


def test_the_record_keeps_each_image_once_the_latest_start_last() -> None:
    data = agent_images.with_image(None, OLD, AT, node_tier=CSI)
    assert data is not None and agent_images.recorded(data, node_tier=CSI) == (OLD,)
    # The newest already: no write.
    assert agent_images.with_image(data, OLD, AT, node_tier=CSI) is None
    data = agent_images.with_image(data, NEW, AT, node_tier=CSI)
    assert data is not None
    # A rollback: the older image starts again and is the newest.
    data = agent_images.with_image(data, OLD, AT, node_tier=CSI)
    assert data is not None and agent_images.recorded(data, node_tier=CSI) == (NEW, OLD)
    for i in range(12):
        data = agent_images.with_image(data, f"ckptdrain:{10 + i}", AT, node_tier=CSI) or data
    kept = agent_images.recorded(data, node_tier=CSI)
    assert len(kept) == agent_images.KEEP and kept[-1] == "ckptdrain:21" and OLD not in kept
    entry = json.loads(data[agent_images.KEY])["images"][-1]
    assert entry == {"image": "ckptdrain:21", "since": "2026-11-29T12:00:00Z",
                     "layout": 2, "nodeTier": CSI}


def test_images_of_another_injection_layout_are_never_given() -> None:
    data = agent_images.with_image(None, OLD, AT, node_tier=CSI,
                                   layout=agent_images.layout_of(CSI) - 1)
    data = agent_images.with_image(data, NEW, AT, node_tier=CSI)
    assert agent_images.recorded(data, node_tier=CSI) == (NEW,)


def test_an_image_recorded_in_one_node_tier_mode_is_never_given_in_the_other() -> None:
    # OLD ran under hostPath only; the switch to csi kept image NEW, which
    # then ran in both modes.
    data = agent_images.with_image(None, OLD, AT, node_tier=HOSTPATH)
    data = agent_images.with_image(data, NEW, AT, node_tier=HOSTPATH)
    data = agent_images.with_image(data, NEW, AT, node_tier=CSI)
    assert agent_images.recorded(data, node_tier=CSI) == (NEW,)
    assert agent_images.recorded(data, node_tier=HOSTPATH) == (OLD, NEW)
    # A way back to hostPath moves NEW to the end there, and keeps it for csi.
    data = agent_images.with_image(data, OLD, AT, node_tier=HOSTPATH)
    assert data is not None
    assert agent_images.recorded(data, node_tier=HOSTPATH) == (NEW, OLD)
    assert agent_images.recorded(data, node_tier=CSI) == (NEW,)
    # Admission never pins OLD onto a csi pod, however many writers run it.
    assert agent_pin.choose(NEW, agent_images.recorded(data, node_tier=CSI), job_pod(),
                            {OLD: 3}).image == NEW


def test_an_entry_of_an_earlier_release_is_given_to_hostpath_pods_only() -> None:
    # 0.1.0 and 0.2.0 recorded no mode, in layout 1. A hostPath pod is still
    # injected in layout 1, so the upgrade pins its running workloads.
    earlier = {agent_images.KEY: json.dumps({"images": [
        {"image": OLD, "since": "2026-11-01T00:00:00Z", "layout": 1}]})}
    assert agent_images.recorded(earlier, node_tier=HOSTPATH) == (OLD,)
    data = agent_images.with_image(earlier, NEW, AT, node_tier=HOSTPATH)
    assert agent_images.recorded(data, node_tier=HOSTPATH) == (OLD, NEW)
    assert agent_pin.choose(NEW, agent_images.recorded(data, node_tier=HOSTPATH), job_pod(),
                            {OLD: 3}).image == OLD
    # The same image recorded again under a mode is listed once.
    again = agent_images.with_image(earlier, OLD, AT, node_tier=HOSTPATH)
    assert agent_images.recorded(again, node_tier=HOSTPATH) == (OLD,)
    # A csi pod's trainer works in a dir of the driver's volume that only
    # this release's restore makes: an earlier image is never pinned onto it.
    assert agent_images.recorded(earlier, node_tier=CSI) == ()
    data = agent_images.with_image(earlier, NEW, AT, node_tier=CSI)
    assert agent_images.recorded(data, node_tier=CSI) == (NEW,)
    assert agent_pin.choose(NEW, agent_images.recorded(data, node_tier=CSI), job_pod(),
                            {OLD: 3}).image == NEW
    assert json.loads(data[agent_images.KEY])["images"][-1]["layout"] == 2


def test_a_record_someone_else_wrote_is_refused_never_overwritten() -> None:
    for text in ("not json", "[]", '{"images": "x"}', '{"images": [{"image": 3}]}'):
        with pytest.raises(agent_images.UnreadableRecord):
            agent_images.recorded({agent_images.KEY: text}, node_tier=CSI)
        with pytest.raises(agent_images.UnreadableRecord):
            agent_images.with_image({agent_images.KEY: text}, NEW, AT, node_tier=CSI)
    assert agent_images.recorded({}, node_tier=CSI) == ()
    assert agent_images.recorded(None, node_tier=CSI) == ()
