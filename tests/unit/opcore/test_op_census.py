"""admission/protection.py: which selected pods are protected, starting or
unprotected or waiting, from the pod objects admission and the kubelet leave; and which
pods a policy selects."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from ckptdrain.operator.admission import protection as pr
from ckptdrain.operator.admission.injection import AGENT
from ckptdrain.operator.admission.pod_store import PodStore

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
CREATED = "2026-01-01T11:59:00Z"  # a minute before NOW


def pod(name: str = "w-0", *, injected: bool = True, policy: str = "train",
        phase: str | None = "Running", agent: dict[str, Any] | None = None,
        reader: bool = False, created: str = CREATED, node: str | None = "node-1",
        conditions: list[dict[str, Any]] | None = None, **meta: Any) -> dict[str, Any]:
    labels = {"app": "train", "ckptdrain.io/inject": "true"}
    if reader:
        labels["ckptdrain.io/reader"] = "0"
    body: dict[str, Any] = {
        "metadata": {"name": name, "labels": labels, "creationTimestamp": created, **meta},
        "spec": {"containers": [{"name": "trainer"}]}, "status": {}}
    if node:
        body["spec"]["nodeName"] = node
    if conditions:
        body["status"]["conditions"] = conditions
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
GATED = {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
SCHEDULED = {"type": "PodScheduled", "status": "True",
             "lastTransitionTime": "2026-01-01T11:59:30Z"}
LONG_AGO = "2026-01-01T11:00:00Z"


def kind(body: dict[str, Any], now: datetime = NOW) -> str:
    found = pr.view(body)
    assert found is not None
    return pr.classify(found, now)


@pytest.mark.parametrize("body, expected", [
    (pod(agent=RUNNING), pr.PROTECTED),
    (pod(agent={**RUNNING, "restartCount": 3}), pr.PROTECTED),  # running again
    (pod(agent={"state": {"running": {}}, "started": False}), pr.STARTING),
    (pod(phase="Pending"), pr.STARTING),  # scheduled: images are pulled
    (pod(phase=None), pr.STARTING),
    (pod(phase="Pending", node=None), pr.UNSCHEDULED),  # being scheduled: no status yet
    (pod(phase="Pending", node=None, conditions=[GATED]), pr.UNSCHEDULED),
    (pod(phase="Pending", node=None, conditions=[SCHEDULED]), pr.STARTING),
    (pod(phase="Pending", agent={"state": {"waiting": {"reason": "PodInitializing"}},
                                 "restartCount": 0}), pr.STARTING),  # restore runs
    (pod(agent={"state": {"terminated": {"exitCode": 1}}}), pr.UNPROTECTED),
    (pod(agent={"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "restartCount": 4}),
     pr.UNPROTECTED),
    (pod(agent={"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "restartCount": 4,
                "lastState": {"terminated": {"exitCode": 1, "finishedAt": LONG_AGO}}}),
     pr.UNPROTECTED),  # down for longer than the restart grace
    (pod(agent={"state": {"waiting": {"reason": "ContainerCreating"}}, "restartCount": 1}),
     pr.UNPROTECTED),  # restarted after an exit: down until it runs again
    (pod(injected=False), pr.UNPROTECTED),
    (pod(reader=True), pr.PROTECTED),  # a reader has no agent: protected once it runs
    (pod(reader=True, phase="Pending"), pr.STARTING),
    (pod(reader=True, phase="Pending", node=None), pr.UNSCHEDULED),
    (pod(phase="Pending", node=None, injected=False), pr.UNPROTECTED),  # will run bare
])
def test_each_state_of_a_pod_and_its_agent(body: dict[str, Any], expected: str) -> None:
    assert kind(body) == expected


def test_a_pod_starting_for_longer_than_the_limit_is_unprotected() -> None:
    starting = pod(phase="Pending")
    assert kind(starting, NOW + timedelta(seconds=pr.STARTING_LIMIT_S - 61)) == pr.STARTING
    assert kind(starting, NOW + timedelta(seconds=pr.STARTING_LIMIT_S)) == pr.UNPROTECTED
    # The limit is a setting.
    found = pr.view(starting)
    assert found is not None
    assert pr.classify(found, NOW + timedelta(seconds=200), limit_s=120) == pr.UNPROTECTED
    # A running agent is protected however old the pod; a reader never
    # counts unprotected for being pending.
    assert kind(pod(agent=RUNNING), NOW + timedelta(days=3)) == pr.PROTECTED
    assert kind(pod(reader=True, phase="Pending"), NOW + timedelta(hours=1)) == pr.STARTING


def test_a_pod_never_scheduled_waits_and_its_clock_starts_at_scheduling() -> None:
    gated = pod(phase="Pending", node=None, conditions=[GATED])
    assert kind(gated, NOW + timedelta(hours=5)) == pr.UNSCHEDULED
    # Scheduled an hour after its creation: the limit counts from then.
    late = pod(phase="Pending", node="node-1", conditions=[
        {**SCHEDULED, "lastTransitionTime": "2026-01-01T13:00:00Z"}])
    at = datetime(2026, 1, 1, 13, tzinfo=UTC)
    assert kind(late, at + timedelta(seconds=pr.STARTING_LIMIT_S - 1)) == pr.STARTING
    assert kind(late, at + timedelta(seconds=pr.STARTING_LIMIT_S + 1)) == pr.UNPROTECTED


def test_an_agent_restart_is_starting_for_a_grace_then_unprotected() -> None:
    ended = {"terminated": {"exitCode": 1, "finishedAt": "2026-01-01T12:00:00Z"}}
    crash = pod(agent={"state": {"waiting": {"reason": "CrashLoopBackOff"}},
                       "restartCount": 1, "lastState": ended})
    exited = pod(agent={"state": ended, "restartCount": 0})
    unstarted = pod(agent={"state": {"running": {}}, "started": False, "restartCount": 1,
                           "lastState": ended})
    for body in (crash, exited, unstarted):
        assert kind(body, NOW + timedelta(seconds=pr.RESTART_GRACE_S - 1)) == pr.STARTING
        assert kind(body, NOW + timedelta(seconds=pr.RESTART_GRACE_S + 1)) == pr.UNPROTECTED
    # Running again: protected, however many restarts.
    assert kind(pod(agent={**RUNNING, "restartCount": 7, "lastState": ended})) == pr.PROTECTED


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
        pod("gated", phase="Pending", node=None, conditions=[GATED]),
        pod("dead", agent={"state": {"terminated": {"exitCode": 137}}}),
        pod("bare", injected=False),
        pod("other", agent=RUNNING, policy="eval"),  # injected for another policy
        pod("done", agent=RUNNING, phase="Succeeded"))]
    census = pr.tally("train", selector, [v for v in views if v is not None], NOW)
    assert census.counts() == {"selected": 6, "protected": 2, "starting": 1, "waiting": 1,
                               "unprotected": 2}
    assert census.unprotected == ("bare", "dead")
    # A selector that misses the bare pod leaves only the injected ones.
    missing = pr.tally("train", {"matchLabels": {"app": "x"}},
                       [v for v in views if v is not None], NOW)
    assert missing.counts()["selected"] == 5 and missing.unprotected == ("dead",)
    assert pr.tally("train", selector, [], NOW).counts() == {
        "selected": 0, "protected": 0, "starting": 0, "waiting": 0, "unprotected": 0}


def _at(seconds: float) -> str:
    return (NOW + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _crash_loop(backoffs: list[int], run_s: int = 5) -> list[tuple[float, dict[str, Any]]]:
    """The agent's statuses as the kubelet writes them: it runs `run_s`,
    exits, waits out each backoff, runs again. restartCount rises when the
    agent starts again, not when it exits."""
    steps: list[tuple[float, dict[str, Any]]] = []
    t, last = 0.0, None
    for restarts, backoff in enumerate(backoffs):
        running = {"state": {"running": {"startedAt": _at(t)}}, "started": True,
                   "restartCount": restarts, **({"lastState": last} if last else {})}
        steps.append((t, pod(agent=running, uid="u1")))
        last = {"terminated": {"exitCode": 1, "startedAt": _at(t),
                               "finishedAt": _at(t + run_s)}}
        steps.append((t + run_s, pod(agent={"state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                            "restartCount": restarts, "lastState": last},
                                     uid="u1")))
        t += run_s + backoff
    return steps


def _verdicts(steps: list[tuple[float, dict[str, Any]]], until: float, start: float = 0.0,
              first: dict[str, Any] | None = None) -> list[tuple[int, str]]:
    """What the census says every 5 s, from what it last saw of the pod;
    from `start`, having seen `first` then (an operator that restarted)."""
    store: PodStore = PodStore()
    changes: list[tuple[int, str]] = []
    seen = 0
    if first is not None:
        store.see("ml", "w-0", pr.view(first), start)
    t = start
    while t <= until:
        while seen < len(steps) and steps[seen][0] <= t:
            store.see("ml", "w-0", pr.view(steps[seen][1]), t)
            seen += 1
        found = pr.classify(store.views("ml")[0], NOW + timedelta(seconds=t))
        if not changes or changes[-1][1] != found:
            changes.append((int(t), found))
        t += 5
    return changes


def test_a_crash_loop_changes_ready_once_not_on_every_backoff() -> None:
    steps = _crash_loop([10, 20, 40, 80, 160, 300, 300, 300])
    changes = _verdicts(steps, steps[-1][0])
    assert changes == [(0, pr.PROTECTED), (5, pr.STARTING), (65, pr.UNPROTECTED)]
    # Ready (no pod unprotected) changes once in the whole loop.
    ready = [v != pr.UNPROTECTED for _, v in changes]
    assert sum(a != b for a, b in itertools.pairwise(ready)) == 1


def test_an_agent_back_from_a_crash_loop_is_protected_once_it_ran_steadily() -> None:
    steps = _crash_loop([10, 20, 40, 80])
    back = steps[-1][0] + 80  # runs again, and keeps running
    steps.append((back, pod(agent={"state": {"running": {"startedAt": _at(back)}},
                                   "started": True, "restartCount": 4,
                                   "lastState": steps[-1][1]["status"][
                                       "initContainerStatuses"][1]["lastState"]}, uid="u1")))
    changes = _verdicts(steps, back + pr.STEADY_S + 10)
    assert changes[-2:] == [(65, pr.UNPROTECTED), (int(back + pr.STEADY_S), pr.PROTECTED)]


def test_an_exit_after_a_day_steady_is_a_new_outage_though_restartcount_is_unchanged() -> None:
    # The kubelet raises restartCount when the agent starts again: at the
    # second exit it still reads 1, and only the run's own times tell.
    first = {"terminated": {"exitCode": 137, "startedAt": _at(-2 * 86400),
                            "finishedAt": _at(-86400)}}
    second = {"terminated": {"exitCode": 137, "startedAt": _at(-86400 + 1),
                             "finishedAt": _at(0)}}
    steady = pod(agent={"state": {"running": {"startedAt": _at(-86400 + 1)}}, "started": True,
                        "restartCount": 1, "lastState": first}, uid="u1")
    exited = pod(agent={"state": second, "restartCount": 1, "lastState": first}, uid="u1")
    backing_off = pod(agent={"state": {"waiting": {"reason": "CrashLoopBackOff"}},
                             "restartCount": 1, "lastState": second}, uid="u1")
    for down in (exited, backing_off):
        store = PodStore()
        store.see("ml", "w-0", pr.view(steady), 0.0)
        store.see("ml", "w-0", pr.view(down), 1.0)
        assert pr.classify(store.views("ml")[0], NOW + timedelta(seconds=1)) == pr.STARTING
        assert pr.classify(store.views("ml")[0],
                           NOW + timedelta(seconds=pr.RESTART_GRACE_S + 1)) == pr.UNPROTECTED


def test_an_operator_restarted_mid_crash_loop_does_not_give_it_a_fresh_grace() -> None:
    steps = _crash_loop([10, 20, 40, 80, 160, 300, 300, 300])
    for restart in (200, 400, 700):
        changes = _verdicts([(t, b) for t, b in steps if t >= restart],
                            steps[-1][0], start=restart,
                            first=next(b for t, b in reversed(steps) if t <= restart))
        assert changes == [(restart, pr.UNPROTECTED)], restart
    # A first exit seen fresh, after a short run, still gets its grace.
    first = pod(agent={"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "restartCount": 0,
                       "lastState": {"terminated": {"exitCode": 1, "startedAt": _at(-5),
                                                    "finishedAt": _at(0)}}}, uid="u1")
    store = PodStore()
    store.see("ml", "w-0", pr.view(first), 0.0)
    assert pr.classify(store.views("ml")[0], NOW + timedelta(seconds=5)) == pr.STARTING


def test_one_restart_stays_starting_until_the_agent_runs_steadily() -> None:
    ended = {"terminated": {"exitCode": 1, "startedAt": _at(-3600), "finishedAt": _at(0)}}
    again = pod(agent={"state": {"running": {"startedAt": _at(10)}}, "started": True,
                       "restartCount": 1, "lastState": ended})
    assert kind(again, NOW + timedelta(seconds=60)) == pr.STARTING
    assert kind(again, NOW + timedelta(seconds=10 + pr.STEADY_S - 1)) == pr.STARTING
    assert kind(again, NOW + timedelta(seconds=10 + pr.STEADY_S)) == pr.PROTECTED
    # Back only after the grace: unprotected until steady.
    late = pod(agent={"state": {"running": {"startedAt": _at(90)}}, "started": True,
                      "restartCount": 1, "lastState": ended})
    assert kind(late, NOW + timedelta(seconds=100)) == pr.UNPROTECTED
    assert kind(late, NOW + timedelta(seconds=90 + pr.STEADY_S)) == pr.PROTECTED


def test_an_agent_running_again_after_a_long_restore_is_starting_until_steady() -> None:
    # The node rebooted: restore runs 5 minutes before the agent starts again.
    last = {"terminated": {"exitCode": 255, "startedAt": _at(-86400), "finishedAt": _at(0)}}
    reinit = pod(phase="Pending", uid="u1", agent={
        "state": {"waiting": {"reason": "PodInitializing"}}, "restartCount": 1,
        "lastState": last})
    back = pod(uid="u1", agent={"state": {"running": {"startedAt": _at(300)}},
                                "started": True, "restartCount": 1, "lastState": last})
    store = PodStore()
    store.see("ml", "w-0", pr.view(reinit), 0.0)
    store.see("ml", "w-0", pr.view(back), 1.0)
    seen = store.views("ml")[0]
    for seconds in (301, 360, 300 + pr.STEADY_S - 1):
        assert pr.classify(seen, NOW + timedelta(seconds=seconds)) == pr.STARTING
    assert pr.classify(seen, NOW + timedelta(seconds=300 + pr.STEADY_S)) == pr.PROTECTED
    # Back only after the starting limit: unprotected until steady.
    late = pod(uid="u1", agent={"state": {"running": {"startedAt": _at(pr.STARTING_LIMIT_S + 5)}},
                                "started": True, "restartCount": 1, "lastState": last})
    store.see("ml", "w-0", pr.view(reinit), 2.0)
    store.see("ml", "w-0", pr.view(late), 3.0)
    assert pr.classify(store.views("ml")[0],
                       NOW + timedelta(seconds=pr.STARTING_LIMIT_S + 10)) == pr.UNPROTECTED


def test_restore_running_again_after_a_sandbox_restart_is_starting_within_the_limit() -> None:
    body = pod(phase="Pending", agent={
        "state": {"waiting": {"reason": "PodInitializing"}}, "restartCount": 1,
        "lastState": {"terminated": {"exitCode": 255, "finishedAt": _at(0)}}})
    for seconds in (30, 90, 300, pr.STARTING_LIMIT_S - 1):
        assert kind(body, NOW + timedelta(seconds=seconds)) == pr.STARTING
    assert kind(body, NOW + timedelta(seconds=pr.STARTING_LIMIT_S + 1)) == pr.UNPROTECTED


def test_an_exit_without_finished_at_gets_the_grace_from_the_pods_last_transition() -> None:
    changed = {"type": "Ready", "status": "False", "lastTransitionTime": _at(0)}
    body = pod(conditions=[SCHEDULED, changed], agent={
        "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "restartCount": 1,
        "lastState": {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown"}}})
    assert kind(body, NOW + timedelta(seconds=pr.RESTART_GRACE_S - 1)) == pr.STARTING
    assert kind(body, NOW + timedelta(seconds=pr.RESTART_GRACE_S + 1)) == pr.UNPROTECTED


def test_a_crash_after_a_steady_run_is_a_new_outage_with_its_own_grace() -> None:
    store = PodStore()
    first = {"terminated": {"exitCode": 1, "startedAt": _at(-3600), "finishedAt": _at(0)}}
    store.see("ml", "w-0", pr.view(pod(uid="u1", agent={
        "state": {"running": {"startedAt": _at(10)}}, "started": True, "restartCount": 1,
        "lastState": first})), 1.0)
    # An hour of steady running, then an exit the node's reboot left without times.
    store.see("ml", "w-0", pr.view(pod(uid="u1", conditions=[
        {"type": "Ready", "status": "False", "lastTransitionTime": _at(3600)}], agent={
        "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "restartCount": 2,
        "lastState": {"terminated": {"exitCode": 137}}})), 2.0)
    found = store.views("ml")[0]
    assert pr.classify(found, NOW + timedelta(seconds=3610)) == pr.STARTING
    assert pr.classify(found, NOW + timedelta(seconds=3600 + pr.RESTART_GRACE_S + 1)) \
        == pr.UNPROTECTED
