"""The pure checks of Kueue conflicts: Kueue's waitForPodsReady as its
Configuration says, flavours against spec.placement, the injected
containers' requests against a Workload's pod sets, and the condition."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from ckptdrain.errors import InvalidInput
from ckptdrain.operator.kueue import conflicts, settings
from ckptdrain.operator.kueue.settings import WaitForPodsReady
from ckptdrain.operator.policy import placement_fit

FACTS = conflicts.PolicyFacts(
    retry_deadline_s=600.0, restore_s=120.0, restore_basis="est",
    placement_terms=[{"matchExpressions": [
        {"key": "ckptdrain.io/nvme", "operator": "In", "values": ["true"]}]}],
    injected={"cpu": Fraction(1, 10), "memory": Fraction(256 * 2**20)},
    injected_names=("ckptdrain-agent",))


# -- Kueue's Configuration -------------------------------------------------------

def test_wait_for_pods_ready_off_unless_enabled() -> None:
    assert settings.read("apiVersion: config.kueue.x-k8s.io/v1beta1\nkind: Configuration\n") \
        == WaitForPodsReady(False)
    assert settings.read("waitForPodsReady: {enable: false, timeout: 1s}") \
        == WaitForPodsReady(False)


def test_enabled_defaults_to_kueues_five_minutes() -> None:
    assert settings.read("waitForPodsReady: {enable: true}") == WaitForPodsReady(True, 300.0)


def test_go_durations_read_as_kueue_reads_them() -> None:
    got = settings.read("waitForPodsReady:\n  enable: true\n  timeout: 1h2m3.5s\n"
                        "  recoveryTimeout: 1500ms\n")
    assert got == WaitForPodsReady(True, 3723.5, 1.5)
    assert settings.go_duration("t", "0") == 0.0


@pytest.mark.parametrize("text, field", [
    ("waitForPodsReady: {enable: true, timeout: 5 minutes}", "waitForPodsReady.timeout"),
    ("waitForPodsReady: {enable: yes please}", "waitForPodsReady.enable"),
    ("waitForPodsReady: [1]", "waitForPodsReady"),
    ("- a list", settings.CONFIG_KEY),
    ("a: [", settings.CONFIG_KEY),
])
def test_a_configuration_it_cannot_read_names_the_field(text: str, field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        settings.read(text)
    assert caught.value.field == field


# -- waitForPodsReady against retryDeadline plus a restore ------------------------

def test_timeout_not_above_retry_deadline_plus_restore_is_a_conflict() -> None:
    found = conflicts.wait_for_pods_ready(WaitForPodsReady(True, 300.0), FACTS)
    assert [c.reason for c in found] == [conflicts.TOO_SHORT]
    text = found[0].message
    assert "waitForPodsReady.timeout (5m)" in text and "retryDeadline (10m)" in text
    assert "12m" in text  # what it must pass: 10m + 2m, the fix names it


def test_timeout_above_the_sum_is_no_conflict() -> None:
    assert conflicts.wait_for_pods_ready(WaitForPodsReady(True, 721.0), FACTS) == []
    # Exactly the sum: Kueue evicts at the timeout, the restore ends there too.
    assert len(conflicts.wait_for_pods_ready(WaitForPodsReady(True, 720.0), FACTS)) == 1


def test_recovery_timeout_is_checked_too_and_disabled_or_unknown_never() -> None:
    found = conflicts.wait_for_pods_ready(WaitForPodsReady(True, 3600.0, 60.0), FACTS)
    assert len(found) == 1 and "waitForPodsReady.recoveryTimeout (1m)" in found[0].message
    assert conflicts.wait_for_pods_ready(WaitForPodsReady(False), FACTS) == []
    assert conflicts.wait_for_pods_ready(None, FACTS) == []


def test_without_a_restore_estimate_retry_deadline_alone_and_it_says_so() -> None:
    facts = conflicts.PolicyFacts(600.0, None, "no bandwidth known")
    assert conflicts.wait_for_pods_ready(WaitForPodsReady(True, 601.0), facts) == []
    found = conflicts.wait_for_pods_ready(WaitForPodsReady(True, 600.0), facts)
    assert "no bandwidth known, so a restore's own time is not added" in found[0].message


# -- eviction for PodsReadyTimeout -------------------------------------------------

def workload(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "job-w"}, "status": status}


def test_evicted_for_pods_ready_timeout_is_a_conflict() -> None:
    w = workload(conditions=[{"type": "Evicted", "status": "True",
                              "reason": "PodsReadyTimeout"}])
    found = conflicts.evicted(w)
    assert found is not None and found.reason == conflicts.EVICTED
    assert "job-w is evicted" in found.message


def test_held_back_after_that_eviction_counts_until_the_backoff_ends() -> None:
    # Kueue v0.13.5 sets Requeued False with the eviction's reason, True
    # (BackoffFinished) once the backoff is over.
    w = workload(conditions=[{"type": "Requeued", "status": "False",
                              "reason": "PodsReadyTimeout"}])
    found = conflicts.evicted(w)
    assert found is not None and "waits to be requeued after its eviction" in found.message
    w = workload(conditions=[{"type": "Requeued", "status": "True",
                              "reason": "BackoffFinished"}])
    assert conflicts.evicted(w) is None


def test_a_readmitted_workload_is_no_conflict_whatever_its_requeue_state() -> None:
    # Kueue keeps requeueState after readmission (an admission check's
    # eviction sets it too): it says nothing of the workload now.
    w = workload(conditions=[{"type": "Evicted", "status": "False",
                              "reason": "QuotaReserved"}], requeueState={"count": 2})
    assert conflicts.evicted(w) is None


def test_other_evictions_are_not_this_conflict() -> None:
    for reason in ("Preempted", "InactiveWorkload"):
        w = workload(conditions=[{"type": "Evicted", "status": "True", "reason": reason}])
        assert conflicts.evicted(w) is None
    assert conflicts.evicted(workload()) is None


# -- flavours against spec.placement -----------------------------------------------

def test_flavors_of_an_admitted_workload_each_once() -> None:
    w = workload(admission={"podSetAssignments": [
        {"name": "a", "flavors": {"cpu": "big", "memory": "big"}},
        {"name": "b", "flavors": {"cpu": "small"}}]})
    assert conflicts.flavors_of(w) == ["big", "small"]
    assert conflicts.flavors_of(w, {"b"}) == ["small"]
    assert conflicts.flavors_of(workload()) == []


def test_flavor_whose_labels_contradict_placement_is_a_conflict() -> None:
    found = conflicts.flavor_outside(workload(), "spot", {"ckptdrain.io/nvme": "false"}, FACTS)
    assert found is not None and found.reason == conflicts.FLAVOR
    assert "ResourceFlavor spot" in found.message
    assert "ckptdrain.io/nvme=false" in found.message
    assert "ckptdrain.io/nvme In [true]" in found.message


def test_flavor_whose_labels_contradict_the_class_nodeselector_is_a_conflict() -> None:
    # The class gives the pods pool=nvme; the flavour's nodes are pool=hdd.
    facts = conflicts.PolicyFacts(600.0, None, "", class_name="fast",
                                  class_selector={"gpu": "h100", "pool": "nvme"})
    found = conflicts.flavor_outside(workload(), "spot", {"gpu": "h100", "pool": "hdd"}, facts)
    assert found is not None and found.reason == conflicts.FLAVOR
    assert "CheckpointClass fast's spec.nodeTier.nodeSelector (pool=nvme)" in found.message
    assert "spec.placement" not in found.message
    both = conflicts.flavor_outside(workload(), "spot", {"ckptdrain.io/nvme": "false",
                                                          "pool": "hdd"},
                                    conflicts.PolicyFacts(**{**FACTS.__dict__,
                                                             "class_name": "fast",
                                                             "class_selector": {"pool": "nvme"}}))
    assert both is not None and "ckptdrain.io/nvme In [true]" in both.message
    assert "(pool=nvme)" in both.message
    for agreeing in ({"gpu": "h100", "pool": "nvme"}, {"zone": "a"}):
        assert conflicts.flavor_outside(workload(), "f", agreeing, facts) is None


def test_flavor_that_meets_or_does_not_say_is_no_conflict() -> None:
    assert conflicts.flavor_outside(workload(), "f", {"ckptdrain.io/nvme": "true"}, FACTS) \
        is None
    assert conflicts.flavor_outside(workload(), "f", {"zone": "a"}, FACTS) is None
    no_placement = conflicts.PolicyFacts(600.0, None, "")
    assert conflicts.flavor_outside(workload(), "f", {"x": "y"}, no_placement) is None


@pytest.mark.parametrize("requirement, labels, expected", [
    ({"key": "k", "operator": "In", "values": ["a", "b"]}, {"k": "b"}, True),
    ({"key": "k", "operator": "In", "values": ["a"]}, {"k": "c"}, False),
    ({"key": "k", "operator": "NotIn", "values": ["a"]}, {"k": "a"}, False),
    ({"key": "k", "operator": "NotIn", "values": ["a"]}, {"k": "b"}, True),
    ({"key": "k", "operator": "Exists"}, {"k": ""}, True),
    ({"key": "k", "operator": "DoesNotExist"}, {"k": "x"}, False),
    ({"key": "k", "operator": "Gt", "values": ["4"]}, {"k": "8"}, True),
    ({"key": "k", "operator": "Gt", "values": ["8"]}, {"k": "8"}, False),
    ({"key": "k", "operator": "Lt", "values": ["8"]}, {"k": "4"}, True),
    ({"key": "k", "operator": "Lt", "values": ["8"]}, {"k": "many"}, False),
    # Keys the flavour does not set: unknown, whatever the operator.
    ({"key": "k", "operator": "DoesNotExist"}, {"other": "x"}, None),
    ({"key": "k", "operator": "In", "values": ["a"]}, {}, None),
])
def test_one_requirement_against_a_flavours_labels(requirement: dict[str, Any],
                                                   labels: dict[str, str],
                                                   expected: bool | None) -> None:
    assert placement_fit.holds(requirement, labels) is expected


def test_terms_are_ored_each_must_be_ruled_out() -> None:
    gpu_a = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
    gpu_h = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
    assert placement_fit.contradictions([gpu_a, gpu_h], {"gpu": "h100"}) is None
    ruled = placement_fit.contradictions([gpu_a, gpu_h], {"gpu": "t4"})
    assert ruled is not None and len(ruled) == 2
    # matchFields (node fields, not labels) never rule a term out.
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    assert placement_fit.contradictions([gpu_a, by_name], {"gpu": "t4"}) is None
    assert placement_fit.contradictions([], {"gpu": "t4"}) is None


def test_one_expression_of_a_term_is_enough_to_rule_it_out() -> None:
    term = {"matchExpressions": [
        {"key": "zone", "operator": "Exists"},
        {"key": "nvme", "operator": "NotIn", "values": ["none"]}]}
    assert placement_fit.contradictions([term], {"zone": "a", "nvme": "none"}) \
        == [term["matchExpressions"][1]]
    assert placement_fit.contradictions([term], {"zone": "a", "nvme": "4t"}) is None


# -- quota and the injected containers ----------------------------------------------

def pod_set(name: str, count: int, **spec: Any) -> dict[str, Any]:
    containers = [{"name": "trainer", "resources": {"requests": {"cpu": "50m"}}}]
    return {"name": name, "count": count, "template": {"spec": {"containers": containers,
                                                                **spec}}}


def test_quota_that_does_not_count_the_agent_per_pod_and_in_total() -> None:
    found = conflicts.quota(workload(), [pod_set("trainer", 2)], FACTS)
    assert found is not None and found.reason == conflicts.QUOTA
    assert "trainer: cpu 100m, memory 256Mi per pod × 2" in found.message
    assert "cpu 200m, memory 512Mi in all" in found.message
    assert "ckptdrain-agent" in found.message
    # Advice that admission accepts: a pod's own overhead without a
    # RuntimeClass defining it is refused.
    assert "RuntimeClass whose overhead.podFixed covers the per-pod amounts" in found.message


def test_overhead_counts_what_it_covers() -> None:
    covered = pod_set("t", 3, overhead={"cpu": "100m", "memory": "256Mi"})
    assert conflicts.quota(workload(), [covered], FACTS) is None
    part = pod_set("t", 3, overhead={"cpu": "150m"})
    found = conflicts.quota(workload(), [part], FACTS)
    assert found is not None and "memory 256Mi per pod × 3" in found.message
    assert "cpu" not in found.message.split("(")[1].split(";")[0]


def test_a_template_that_holds_the_containers_is_counted() -> None:
    carried = pod_set("t", 2)
    carried["template"]["spec"]["initContainers"] = [{"name": "ckptdrain-agent"}]
    assert conflicts.quota(workload(), [carried], FACTS) is None


# -- the condition -------------------------------------------------------------------

def test_condition_true_without_conflicts_says_what_was_not_checked() -> None:
    got = conflicts.condition([], ["Kueue's configuration not read"])
    assert got["status"] == "True" and got["reason"] == conflicts.COMPATIBLE
    assert got["message"] == ("no conflict with Kueue's settings found in what was checked; "
                              "Kueue's configuration not read")
    assert conflicts.condition([])["message"] == "no conflict with Kueue's settings known"


def test_many_workloads_are_counted_and_a_few_named_the_message_bounded() -> None:
    found = [conflicts.Conflict(conflicts.QUOTA, f"Workload w{i:03}: " + "x" * 300,
                                f"w{i:03}") for i in range(200)]
    found.append(conflicts.Conflict(conflicts.EVICTED, "Workload w150 is evicted", "w150"))
    got = conflicts.condition(found, [f"Workload n{i} not read" for i in range(500)])
    message = got["message"]
    assert got["reason"] == conflicts.EVICTED
    assert message.startswith("Workload w150 is evicted; Workload w000: ")
    assert "QuotaExcludesInjected also on 197 more Workloads (w003, w004, w005, …)" \
        in message
    assert len(message) <= conflicts.MESSAGE_MAX and message.endswith("…")


def test_condition_false_names_every_conflict_most_urgent_reason_first() -> None:
    quota = conflicts.Conflict(conflicts.QUOTA, "q", "w")
    short = conflicts.Conflict(conflicts.TOO_SHORT, "t")
    evicted = conflicts.Conflict(conflicts.EVICTED, "e", "w")
    got = conflicts.condition([quota, short, evicted, quota])
    assert got == {"type": "KueueCompatible", "status": "False",
                   "reason": conflicts.EVICTED, "message": "e; t; q"}


def test_a_pod_that_stays_guaranteed_is_counted_with_the_guaranteed_amounts() -> None:
    facts = conflicts.PolicyFacts(600.0, None, "", injected={"cpu": Fraction(1, 10)},
                                  injected_names=("ckptdrain-agent",),
                                  injected_guaranteed={"cpu": Fraction(1)})
    found = conflicts.quota(workload(), [pod_set("t", 2)], facts, lambda _: True)
    assert found is not None and "cpu 1 per pod × 2" in found.message
    found = conflicts.quota(workload(), [pod_set("t", 2)], facts)
    assert found is not None and "cpu 100m per pod × 2" in found.message
