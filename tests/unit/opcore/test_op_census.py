"""admission/protection.py: which selected pods are protected, starting or
unprotected, from the pod objects admission and the kubelet leave; and which
pods a policy selects."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ckptdrain.operator.admission import protection as pr
from ckptdrain.operator.admission.injection import AGENT

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
CREATED = "2026-01-01T11:59:00Z"  # a minute before NOW


def pod(name: str = "w-0", *, injected: bool = True, policy: str = "train",
        phase: str | None = "Running", agent: dict[str, Any] | None = None,
        reader: bool = False, created: str = CREATED, **meta: Any) -> dict[str, Any]:
    labels = {"app": "train", "ckptdrain.io/inject": "true"}
    if reader:
        labels["ckptdrain.io/reader"] = "0"
    body: dict[str, Any] = {
        "metadata": {"name": name, "labels": labels, "creationTimestamp": created, **meta},
        "spec": {"containers": [{"name": "trainer"}]}, "status": {}}
    if phase:
        body["status"]["phase"] = phase
    if injected:
        body["metadata"]["annotations"] = {"ckptdrain.io/injected": "true",
                                           "ckptdrain.io/policy": policy}
        body["spec"]["initContainers"] = [{"name": "ckptdrain-restore"}] + (
            [] if reader else [{"name": AGENT, "restartPolicy": "Always"}])
    if agent is not None:
        body["status"]["initContainerStatuses"] = [
            {"name": "ckptdrain-restore", "state": {"terminated": {"exitCode": 0}}},
            {"name": AGENT, **agent}]
    return body


RUNNING = {"state": {"running": {}}, "started": True, "restartCount": 0}


def kind(body: dict[str, Any], now: datetime = NOW) -> str:
    found = pr.view(body)
    assert found is not None
    return pr.classify(found, now)


@pytest.mark.parametrize("body, expected", [
    (pod(agent=RUNNING), pr.PROTECTED),
    (pod(agent={**RUNNING, "restartCount": 3}), pr.PROTECTED),  # running again
    (pod(agent={"state": {"running": {}}, "started": False}), pr.STARTING),
    (pod(phase="Pending"), pr.STARTING),  # being scheduled: no status yet
    (pod(phase=None), pr.STARTING),
    (pod(phase="Pending", agent={"state": {"waiting": {"reason": "PodInitializing"}},
                                 "restartCount": 0}), pr.STARTING),  # restore runs
    (pod(agent={"state": {"terminated": {"exitCode": 1}}}), pr.UNPROTECTED),
    (pod(agent={"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "restartCount": 4}),
     pr.UNPROTECTED),
    (pod(agent={"state": {"waiting": {"reason": "ContainerCreating"}}, "restartCount": 1}),
     pr.UNPROTECTED),  # restarted after an exit: down until it runs again
    (pod(injected=False), pr.UNPROTECTED),
    (pod(reader=True), pr.PROTECTED),  # a reader has no agent: protected once it runs
    (pod(reader=True, phase="Pending"), pr.STARTING),
])
def test_each_state_of_a_pod_and_its_agent(body: dict[str, Any], expected: str) -> None:
    assert kind(body) == expected


def test_a_pod_starting_for_longer_than_the_limit_is_unprotected() -> None:
    starting = pod(phase="Pending")
    assert kind(starting, NOW + timedelta(seconds=pr.STARTING_LIMIT_S - 61)) == pr.STARTING
    assert kind(starting, NOW + timedelta(seconds=pr.STARTING_LIMIT_S)) == pr.UNPROTECTED
    # A running agent is protected however old the pod; so is a reader.
    assert kind(pod(agent=RUNNING), NOW + timedelta(days=3)) == pr.PROTECTED
    assert kind(pod(reader=True, phase="Pending"), NOW + timedelta(hours=1)) \
        == pr.UNPROTECTED


@pytest.mark.parametrize("body", [
    pod(phase="Succeeded"), pod(phase="Failed"),
    pod(deletionTimestamp="2026-01-01T12:00:00Z"),
    pod(injected=False, phase="Succeeded"),
])
def test_finished_and_departing_pods_are_not_counted(body: dict[str, Any]) -> None:
    assert pr.view(body) is None


def test_a_policy_selects_its_injected_pods_and_the_bare_pods_its_selector_matches() -> None:
    selector = {"matchLabels": {"app": "train"}}
    views = [pr.view(b) for b in (
        pod("ok-0", agent=RUNNING), pod("ok-1", agent=RUNNING),
        pod("new", phase="Pending"),
        pod("dead", agent={"state": {"terminated": {"exitCode": 137}}}),
        pod("bare", injected=False),
        pod("other", agent=RUNNING, policy="eval"),  # injected for another policy
        pod("done", agent=RUNNING, phase="Succeeded"))]
    census = pr.tally("train", selector, [v for v in views if v is not None], NOW)
    assert census.counts() == {"selected": 5, "protected": 2, "starting": 1,
                               "unprotected": 2}
    assert census.unprotected == ("bare", "dead")
    # A selector that misses the bare pod leaves only the injected ones.
    missing = pr.tally("train", {"matchLabels": {"app": "x"}},
                       [v for v in views if v is not None], NOW)
    assert missing.counts()["selected"] == 4 and missing.unprotected == ("dead",)
    assert pr.tally("train", selector, [], NOW).counts() == {
        "selected": 0, "protected": 0, "starting": 0, "unprotected": 0}
