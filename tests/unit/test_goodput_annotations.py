"""The annotations goodput accounting reads (contract/goodput.py): parsed or
ignored, never fatal; round-tripped; a pod's view of its node and its end."""

from __future__ import annotations

import json

import pytest
from tests.support.goodput_views import T0

from ckptdrain.contract.goodput import (
    AgentView,
    PodView,
    RestoreView,
    parse_agent,
    parse_restore,
    pod_view,
)


@pytest.mark.parametrize("text", [None, "", "not json", "[]", '{"trainingAt": "soon"}',
                                  '{"completed": {"x": 1, "5": "y"}, "step": -3}',
                                  '{"blockedSeconds": NaN}'])
def test_annotations_that_do_not_parse_are_ignored_not_fatal(text: str | None) -> None:
    view = parse_agent(text)
    assert view is None or (view.training_at is None and view.step is None
                            and view.completed == () and view.blocked_s == 0.0)
    assert parse_restore(text) is None


def test_annotations_round_trip() -> None:
    agent = AgentView(training_at=T0, first_step=3, blocked_s=1.25, interrupted_at=T0 + 9,
                      step=9, step_s=0.5, completed=((5, T0 + 4),), newest_local=9,
                      newest_global=5)
    assert parse_agent(agent.to_json()) == agent
    restore = RestoreView("restored", T0, 1.5, step=5, tier="local", attempts=2)
    assert parse_restore(restore.to_json()) == restore
    meta = {"labels": {"ckptdrain.io/writer": "3"},
            "annotations": {"ckptdrain.io/goodput": agent.to_json(),
                            "ckptdrain.io/restore-result": restore.to_json()}}
    assert pod_view("p", meta) == PodView("p", "3", agent, restore)
    assert pod_view("p", {"annotations": {}}) is None


def test_pod_view_reads_when_the_pod_got_its_node_and_ended() -> None:
    meta = {"annotations": {"ckptdrain.io/goodput": AgentView(training_at=T0).to_json()}}
    done = {"phase": "Succeeded", "startTime": "2023-11-14T22:13:20Z", "containerStatuses": [
        {"name": "trainer", "state": {"terminated": {"finishedAt": "2023-11-14T22:30:00Z"}}},
        {"name": "other", "state": {"terminated": None, "running": {}}}]}
    view = pod_view("p", meta, done)
    assert view is not None and view.finished
    assert (view.bound_at, view.finished_at) == (T0, T0 + 1000)
    # As the Python client re-serializes it; a pending pod has no node yet.
    running = pod_view("p", meta, {"phase": "Running", "startTime": "2023-11-14T22:13:20+00:00"})
    assert running is not None and (running.bound_at, running.finished) == (T0, False)
    pending = pod_view("p", meta, {"phase": "Pending", "startTime": "soon"})
    assert pending is not None and pending.bound_at is None


def test_a_pods_reader_label_reaches_its_view() -> None:
    view = pod_view("r-0", {"labels": {"ckptdrain.io/reader": "3"}, "annotations": {
        "ckptdrain.io/restore-result": json.dumps({"outcome": "reshard", "startedAt": T0,
                                                   "step": 40, "tier": "global"})}})
    assert view is not None and (view.writer, view.reader) == (None, "3")
    assert view.restore is not None and not view.restore.failed
