"""The namespace-label sweep of the joint budgets, with the apiserver's
reads replaced and a clock of the test's: namespaces with no trusted reading
are read by one bounded sweep at a time on the leading replica; what it
cannot reach gives no share for that pass and brings the joint pass again;
a policy's own pass never takes more than its last joint share meanwhile."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from tests.support.tenancy_wiring import CFG, LOG, fake_cluster, policy

from ckptdrain.operator import class_events
from ckptdrain.operator.apiserver import class_view, leadership, namespace_labels
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.bandwidth import answer_memo, rebalance


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, no_checkpoint_classes: class_view.ClassView
            ) -> Iterator[dict[str, Any]]:
    yield from fake_cluster(monkeypatch, no_checkpoint_classes)


class Clock:
    """The monotonic clock the label reads see; a GET that times out
    advances it by its timeout. Like a real clock it moves between any two
    readings (TICK_S each), so a sweep's first read is cut a little short
    of READ_TIMEOUT_S, as it is in production."""

    TICK_S = 1e-6

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += self.TICK_S
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(namespace_labels.time, "monotonic", c)
    return c


def _two_policies(cluster: dict[str, Any]) -> tuple[dict[Any, Any], dict[Any, Any]]:
    cluster["labels"]["other"] = {"tenant": "a"}
    policies = {("ml", "a"): [policy("ml", "a")], ("other", "b"): [policy("other", "b")]}
    return policies, {key: [object()] for key in policies}


def _joint_pass_without_publishing(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Each joint pass's budgets and whether its lock was held while the
    labels were read; the pass publishes nothing."""
    passes: list[dict[str, Any]] = []

    def locked(cfg: Any, policies: Any, pods: Any, logger: Any, then: Any = None) -> None:
        passes.append(rebalance.budgets(cfg, policies, pods, read_untrusted=False))

    monkeypatch.setattr(rebalance, "_rebalance_moved_locked", locked)
    return passes


def test_a_sweep_over_namespaces_that_time_out_is_bounded_in_time_and_gets(
        cluster: dict[str, Any], clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    gets: list[tuple[str, float]] = []

    def timing_out(path: str, query: Any, timeout: float) -> dict[str, Any]:
        gets.append((path.rsplit("/", 1)[1], timeout))
        clock.now += timeout
        raise TimeoutError("timed out")

    monkeypatch.setattr(apiserver_reads, "get_json", timing_out)
    policies = {(f"ns-{i}", "p"): [policy(f"ns-{i}", "p")] for i in range(10)}
    passes = _joint_pass_without_publishing(monkeypatch)
    start = clock.now
    rebalance.run(rebalance.JOINT, CFG, policies, {}, LOG)  # type: ignore[arg-type]
    # Ten namespaces unreachable: one timed-out GET, not ten, and the whole
    # sweep within one read's timeout; the pass comes again to go on.
    assert [ns for ns, _ in gets] == ["ns-0"]
    assert gets[0][1] == pytest.approx(namespace_labels.READ_TIMEOUT_S, abs=1e-3)
    assert clock.now - start == pytest.approx(namespace_labels.READ_TIMEOUT_S, abs=1e-3)
    assert passes == [{}]
    assert cluster["scheduled"] == [(rebalance.JOINT, rebalance.RETRY_DELAY_S)]
    # Callers after it (a reconcile's budgets) send no GET for the failure
    # remembered: the next namespace, one GET, again within the bound.
    clock.now += 1
    rebalance.budgets(CFG, policies, {})  # type: ignore[arg-type]
    assert [ns for ns, _ in gets] == ["ns-0", "ns-1"]
    assert cluster["scheduled"][-1] == (rebalance.JOINT, rebalance.RETRY_DELAY_S)


def test_callers_at_once_send_one_get_for_a_namespace_that_times_out(
        cluster: dict[str, Any], clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    gets: list[str] = []
    reading, release = threading.Event(), threading.Event()

    def timing_out(path: str, query: Any, timeout: float) -> dict[str, Any]:
        gets.append(path.rsplit("/", 1)[1])
        reading.set()
        release.wait(10)
        clock.now += timeout
        raise TimeoutError("timed out")

    monkeypatch.setattr(apiserver_reads, "get_json", timing_out)
    callers = [threading.Thread(target=namespace_labels.read_untrusted,
                                args=(["ml"], CFG.namespace_recheck_s)) for _ in range(4)]
    callers[0].start()
    assert reading.wait(10)
    for caller in callers[1:]:
        caller.start()  # they wait for the sweep under way, then use its failure
    release.set()
    for caller in callers:
        caller.join(10)
    assert gets == ["ml"]


def test_a_sweeps_timeout_cut_short_is_remembered(
        cluster: dict[str, Any], clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    # The sweep's deadline is the operator's own, not an admission's: a GET
    # it cut below READ_TIMEOUT_S that times out says the apiserver is away,
    # and the sweeps after it within FAILURE_MEMORY_S send none.
    gets: list[float] = []

    def timing_out(path: str, query: Any, timeout: float) -> dict[str, Any]:
        gets.append(timeout)
        clock.now += timeout
        raise TimeoutError("timed out")

    monkeypatch.setattr(apiserver_reads, "get_json", timing_out)
    for _ in range(3):
        namespace_labels.read_untrusted(["ns-0"], CFG.namespace_recheck_s)
        clock.now += 0.5
    assert len(gets) == 1 and gets[0] < namespace_labels.READ_TIMEOUT_S
    assert clock.now - 1000.0 < namespace_labels.READ_TIMEOUT_S + \
        namespace_labels.FAILURE_MEMORY_S


def test_the_sweep_cuts_each_read_to_the_time_left(
        cluster: dict[str, Any], clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    timeouts: list[float] = []

    def slow(path: str, query: Any, timeout: float) -> dict[str, Any]:
        timeouts.append(timeout)
        clock.now += 1.0
        return {"metadata": {"labels": {"tenant": "a"}}}

    monkeypatch.setattr(apiserver_reads, "get_json", slow)
    unread = namespace_labels.read_untrusted([f"ns-{i}" for i in range(5)],
                                             CFG.namespace_recheck_s)
    assert timeouts == pytest.approx([3.0, 2.0, 1.0], abs=1e-3)
    assert unread == ["ns-3", "ns-4"]  # not reached: the pass that asked comes again


def test_trusted_readings_older_than_max_age_cost_no_get(
        cluster: dict[str, Any], clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    policies, pods = _two_policies(cluster)
    for namespace in ("ml", "other"):  # as the recheck reads them
        namespace_labels.fresh(namespace)
    clock.now += namespace_labels.MAX_AGE_S + 1  # old, still trusted
    cluster["read"].clear()
    passes = _joint_pass_without_publishing(monkeypatch)
    parts = rebalance.budgets(CFG, policies, pods)  # type: ignore[arg-type]
    rebalance.run(rebalance.JOINT, CFG, policies, pods, LOG)  # type: ignore[arg-type]
    assert cluster["read"] == []
    assert set(parts) == set(passes[0]) == {("ml", "a"), ("other", "b")}


def test_a_standby_reads_no_labels_for_the_budgets(
        cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    policies, pods = _two_policies(cluster)
    monkeypatch.setattr(leadership, "active", lambda: False)
    passes = _joint_pass_without_publishing(monkeypatch)
    parts = rebalance.budgets(CFG, policies, pods)  # type: ignore[arg-type]
    rebalance.run(rebalance.JOINT, CFG, policies, pods, LOG)  # type: ignore[arg-type]
    assert cluster["read"] == [] and parts == passes[0] == {}
    assert cluster["scheduled"] == []


def test_the_joint_pass_reads_before_its_lock(
        cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    policies, pods = _two_policies(cluster)
    held_while_read: list[bool] = []
    real = apiserver_reads.get_json

    def watched(path: str, query: Any, timeout: float) -> dict[str, Any]:
        held_while_read.append(rebalance._joint_lock.locked())
        return real(path, query, timeout)

    monkeypatch.setattr(apiserver_reads, "get_json", watched)
    passes = _joint_pass_without_publishing(monkeypatch)
    rebalance.run(rebalance.JOINT, CFG, policies, pods, LOG)  # type: ignore[arg-type]
    assert sorted(cluster["read"]) == ["ml", "other"] and held_while_read == [False, False]
    assert set(passes[0]) == {("ml", "a"), ("other", "b")}
    assert cluster["scheduled"] == []  # all read: no retry, no second pass


def test_labels_read_by_another_than_the_recheck_still_bring_the_joint_pass(
        cluster: dict[str, Any], clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    policies, pods = _two_policies(cluster)
    labels_of_other = cluster["labels"].pop("other")  # 403: the RBAC rolled back
    passes = _joint_pass_without_publishing(monkeypatch)
    rebalance.run(rebalance.JOINT, CFG, policies, pods, LOG)  # type: ignore[arg-type]
    assert set(passes[-1]) == {("ml", "a")}
    cluster["labels"]["other"] = labels_of_other  # readable again
    clock.now += namespace_labels.FAILURE_MEMORY_S + 1
    # a's own pass reads it first (its namespace holds no reading), and asks
    # for the joint pass its budgets did not compute.
    assert set(rebalance.budget_of(CFG, policies, pods, ("ml", "a"))) == {  # type: ignore[arg-type]
        ("ml", "a")}
    assert cluster["scheduled"] == [(rebalance.JOINT, rebalance.REBALANCE_DELAY_S)]
    cluster["scheduled"].clear()
    # The recheck then reads labels that are no news to it, yet the last
    # joint pass did not parse them: it asks for one too.
    monkeypatch.setattr(class_events, "_recheck_after", "")
    class_events.recheck(CFG, kopf.Memo(config=CFG), LOG,
                         {"checkpointpolicy_index": policies, "pod_index": pods}, 30.0)
    assert cluster["scheduled"] == [(rebalance.JOINT, rebalance.REBALANCE_DELAY_S)]
    rebalance.run(rebalance.JOINT, CFG, policies, pods, LOG)  # type: ignore[arg-type]
    assert [passes[-1][key][1].budget for key in sorted(passes[-1])] == pytest.approx(
        [50e6, 50e6])
    assert not rebalance.joint_behind()


def test_a_policy_pass_missing_a_namespace_never_takes_more_than_its_joint_share(
        cluster: dict[str, Any], clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    # One slow namespace sorted first uses up the sweep's time: the budgets
    # then split the cap without the policies of the namespaces not reached.
    real = apiserver_reads.get_json

    def aaa_times_out(path: str, query: Any, timeout: float) -> dict[str, Any]:
        if path.endswith("/aaa"):
            clock.now += timeout
            raise TimeoutError("timed out")
        return real(path, query, timeout)

    monkeypatch.setattr(apiserver_reads, "get_json", aaa_times_out)
    monkeypatch.setattr(rebalance, "_joint_last", {})
    monkeypatch.setattr(rebalance, "_answers", answer_memo.AnswerMemo())
    published: list[Any] = []
    monkeypatch.setattr(rebalance, "_rebalance", lambda key, *a: published.append(key))
    monkeypatch.setattr(rebalance, "_publish_scale", lambda *a, **k: False)
    cluster["labels"].update({"aaa": {"tenant": "a"}, "other": {"tenant": "a"}})
    policies = {key: [policy(*key)] for key in (("aaa", "c"), ("ml", "a"), ("other", "b"))}
    pods = {key: [object()] for key in policies}
    namespace_labels.fresh("ml")  # as its own reconcile reads it
    # No joint share yet: nothing to publish (not the whole cap), and a
    # joint pass asked for to read on.
    assert rebalance.budget_of(CFG, policies, pods, ("ml", "a")) == {}  # type: ignore[arg-type]
    assert cluster["scheduled"][-1] == (rebalance.JOINT, rebalance.RETRY_DELAY_S)
    # The joint pass reads on from where the sweep stopped and splits the
    # cap between the policies whose namespaces it could judge.
    clock.now += rebalance.RETRY_DELAY_S - namespace_labels.READ_TIMEOUT_S
    rebalance.run(rebalance.JOINT, CFG, policies, pods, LOG)  # type: ignore[arg-type]
    assert sorted(published) == [("ml", "a"), ("other", "b")]
    last = rebalance._joint_last
    assert [last[key][1].budget for key in sorted(last)] == pytest.approx([50e6, 50e6])
    # Readings lost again (a new term), the slow namespace first again: a
    # policy's own pass gives no more than the joint share it last had.
    namespace_labels.forget()
    namespace_labels.fresh("ml")
    clock.now += namespace_labels.FAILURE_MEMORY_S + 1
    mine = rebalance.budget_of(CFG, policies, pods, ("ml", "a"))  # type: ignore[arg-type]
    assert mine[("ml", "a")][0].allowed_bandwidth == pytest.approx(50e6)
    assert mine[("ml", "a")][1].budget == pytest.approx(50e6)
