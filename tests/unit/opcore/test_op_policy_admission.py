"""admission/policy_rules.py with the apiserver's reads replaced: which
policy CREATEs and UPDATEs are refused, and what the refusal says."""

from __future__ import annotations

import asyncio
from typing import Any

import jsonpatch
import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import injection, policy_rules
from ckptdrain.operator.admission.rules import Refused
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.policy import spec as pol

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")


def body(name: str, selector: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {"selector": {"matchLabels": {"app": name}} if selector is None
                         else selector,
                         "model": {"parameters": "7B"}, "interval": "10m", "writers": 2,
                         "localTier": {"path": "/mnt/ckptdrain/n"},
                         "storage": {"uri": "s3://bucket/p"}}
    s.update(spec)
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": s}


def pod_of(policy: dict[str, Any], name: str, phase: str = "Running",
           job: str | None = None, **meta: Any) -> dict[str, Any]:
    """A pod as admission injected it under `policy` (its env and volumes
    from the real pod patch)."""
    p = pol.parse("ml", policy["metadata"]["name"], policy["spec"], CFG)
    bare: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ml", **meta,
                     "labels": {"ckptdrain.io/inject": "true"},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                          "name": job, "controller": True}] if job else []},
        "spec": {"containers": [{"name": "trainer", "image": "t:1"}]},
        "status": {"phase": phase}}
    return jsonpatch.apply_patch(bare, injection.build_pod_patch(bare, p, CFG, default_rate=1e9))


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The apiserver's reads over `policies`, `pods` (as pod_of makes them)
    and `jobs` (name: body), recording each read."""
    state: dict[str, Any] = {"policies": [], "pods": [], "jobs": {}, "reads": []}

    def list_policies(namespace: str, timeout: float = 5) -> list[dict[str, Any]]:
        state["reads"].append(("policies", namespace))
        assert 0 < timeout <= apiserver_reads.ADMISSION_READ_TIMEOUT_S
        return list(state["policies"])

    def first_injected_pod(namespace: str, policy: str, wanted: Any,
                           deadline: float) -> dict[str, Any] | None:
        state["reads"].append(("pods", namespace, policy))
        for pod in state["pods"]:
            notes = pod["metadata"].get("annotations") or {}
            if notes.get("ckptdrain.io/policy") == policy \
                    and pod["status"]["phase"] != "Succeeded" and wanted(pod):
                return dict(pod)
        return None

    def job_or_none(namespace: str, name: str, deadline: float) -> dict[str, Any] | None:
        state["reads"].append(("job", namespace, name))
        return state["jobs"].get(name)

    monkeypatch.setattr(apiserver_reads, "list_policies", list_policies)
    monkeypatch.setattr(apiserver_reads, "first_injected_pod", first_injected_pod)
    monkeypatch.setattr(apiserver_reads, "job_or_none", job_or_none)
    return state


def admit(new: dict[str, Any], old: dict[str, Any] | None = None) -> None:
    asyncio.run(policy_rules.admit_policy(new, old, "ml", CFG))


def refusal(new: dict[str, Any], old: dict[str, Any] | None = None) -> Refused:
    with pytest.raises(Refused) as caught:
        admit(new, old)
    return caught.value


def test_an_overlapping_create_is_refused_naming_the_other_and_the_labels(
        cluster: dict[str, Any]) -> None:
    cluster["policies"] = [body("llama", {"matchLabels": {"app": "llama"}})]
    wide = body("gpus", {"matchExpressions": [{"key": "app", "operator": "Exists"}]})
    refused = refusal(wide)
    assert refused.code == 403
    assert "CheckpointPolicy llama in ml" in str(refused)
    assert "app=llama, ckptdrain.io/inject=true" in str(refused)
    assert str(refused).startswith("spec.selector:")


def test_exclusive_selectors_and_the_policy_itself_are_no_overlap(
        cluster: dict[str, Any]) -> None:
    cluster["policies"] = [body("llama", {"matchLabels": {"app": "llama"}})]
    admit(body("mistral", {"matchLabels": {"app": "mistral"}}))
    admit(body("gpus", {"matchExpressions": [
        {"key": "app", "operator": "Exists"},
        {"key": "app", "operator": "NotIn", "values": ["llama"]}]}))
    # An update of llama meets itself in the list: not a conflict.
    admit(body("llama", {"matchLabels": {"app": "llama", "team": "x"}}), cluster["policies"][0])


def test_a_policy_selecting_only_pods_that_cannot_opt_in_is_no_overlap(
        cluster: dict[str, Any]) -> None:
    cluster["policies"] = [body("bare", {"matchExpressions": [
        {"key": "ckptdrain.io/inject", "operator": "DoesNotExist"}]})]
    admit(body("llama"))


def test_a_policy_being_deleted_still_overlaps_as_pod_admission_counts_it(
        cluster: dict[str, Any]) -> None:
    going = body("old", {})  # selects every opted-in pod
    assert going["spec"]["selector"] == {}
    going["metadata"]["deletionTimestamp"] = "2026-11-29T00:00:00Z"
    cluster["policies"] = [going]
    refused = refusal(body("llama"))
    assert refused.code == 403
    assert "CheckpointPolicy old (being deleted" in str(refused)
    assert "waits until then" in str(refused)
    del going["metadata"]["deletionTimestamp"]
    assert "being deleted" not in str(refusal(body("llama")))
    cluster["policies"] = []
    admit(body("llama"))  # once it is gone


def test_an_unreadable_list_refuses_rather_than_guess(
        cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(namespace: str, timeout: float = 5) -> list[dict[str, Any]]:
        raise apiserver_reads.ApiError(500, "etcd down")

    monkeypatch.setattr(apiserver_reads, "list_policies", broken)
    refused = refusal(body("llama"))
    assert refused.code == 503 and "retry" in str(refused)


def test_a_bad_spec_is_refused_before_any_read(cluster: dict[str, Any]) -> None:
    refused = refusal(body("llama", localTier={"path": "/etc"}))
    assert refused.code == 422 and "spec.localTier.path" in str(refused)
    assert cluster["reads"] == []


def test_moving_the_store_under_a_live_pod_is_refused_naming_it_and_the_ways(
        cluster: dict[str, Any]) -> None:
    old = body("llama")
    cluster["policies"] = [old]
    cluster["pods"] = [pod_of(old, "llama-0"), pod_of(old, "llama-1")]
    refused = refusal(body("llama", storage={"uri": "s3://other/p"}), old)
    assert refused.code == 403
    message = str(refused)
    assert message.startswith("spec.storage.uri: cannot change while pods of policy llama")
    assert "(pod llama-0: running or pending)" in message
    assert "retry" not in message
    assert "create a policy of another name" in message and "spec.relocation.reason" in message
    assert "running pods keep writing to the old location" in message
    assert "restart the whole job together" in message
    assert "restore from the new location" not in message
    # The selector did not change: the other policies were not read.
    assert ("policies", "ml") not in cluster["reads"]


def test_changing_writers_under_a_live_pod_says_suspend_change_resume(
        cluster: dict[str, Any]) -> None:
    old = body("llama")
    cluster["pods"] = [pod_of(old, "llama-0")]
    message = str(refusal(body("llama", writers=4, relocation={"reason": "x"}), old))
    assert message.startswith("spec.writers:") and "suspend the job" in message
    assert "spec.relocation" not in message


def test_a_move_with_no_live_pod_or_with_a_new_reason_is_admitted(
        cluster: dict[str, Any]) -> None:
    old = body("llama")
    admit(body("llama", storage={"uri": "s3://other/p"}, writers=4), old)
    cluster["pods"] = [pod_of(old, "llama-0"), pod_of(body("other"), "x-0")]
    admit(body("llama", storage={"uri": "s3://other/p"},
               relocation={"reason": "bucket migration"}), old)
    admit(body("llama", interval="20m"), old)
    assert [r for r in cluster["reads"] if r[0] == "pods"] == [("pods", "ml", "llama")]


def test_one_pod_read_when_both_selector_and_location_change(
        cluster: dict[str, Any]) -> None:
    old = body("llama")
    cluster["pods"] = [pod_of(old, "llama-0")]
    refused = refusal(body("llama", {"matchLabels": {"app": "x"}},
                           storage={"uri": "s3://other/p"},
                           localTier={"path": "/mnt/ckptdrain/m"}),
                      old)
    assert str(refused).startswith("spec.storage.uri, spec.localTier.path: cannot change")
    # The namespace's policies (overlap), every namespace's (node
    # directories: no view was given), then one pod read.
    assert cluster["reads"] == [("policies", "ml"), ("policies", ""), ("pods", "ml", "llama")]


def test_pods_being_deleted_or_failed_under_a_running_job_count_as_live(
        cluster: dict[str, Any]) -> None:
    old, moved = body("llama"), body("llama", storage={"uri": "s3://other/p"})
    cluster["pods"] = [pod_of(old, "done", "Succeeded"),
                       pod_of(old, "bare-failed", "Failed"),
                       pod_of(old, "failed-of-done-job", "Failed", job="done")]
    cluster["jobs"] = {"done": {"status": {"conditions": [
        {"type": "Complete", "status": "True"}]}}}
    admit(moved, old)
    flushing = pod_of(old, "flushing", deletionTimestamp="2026-11-29T08:00:00Z")
    cluster["pods"].append(flushing)
    # Each says why the pod counts, and that a retry passes once that ends.
    message = str(refusal(moved, old))
    assert "(pod flushing: being deleted: it flushes its emergency checkpoint" in message
    assert "retry once it is gone" in message
    cluster["pods"].remove(flushing)
    cluster["pods"].append(pod_of(old, "backing-off", "Failed", job="train"))
    cluster["jobs"]["train"] = {"status": {"conditions": [
        {"type": "Suspended", "status": "False"}]}}
    message = str(refusal(moved, old))
    assert "(pod backing-off: Failed, and its Job is not finished" in message
    assert "retry once the Job has finished or is deleted" in message
    # Gone or finished, its Job makes no pod again.
    del cluster["jobs"]["train"]
    admit(moved, old)
    cluster["jobs"]["train"] = {"status": {"conditions": [
        {"type": "Failed", "status": "True"}]}}
    admit(moved, old)


def test_a_create_over_live_pods_of_its_namesake_is_refused_where_it_differs(
        cluster: dict[str, Any]) -> None:
    old = body("llama")
    cluster["pods"] = [pod_of(old, "llama-0")]
    admit(body("llama", interval="20m"))  # same store, path and writers
    refused = refusal(body("llama", storage={"uri": "s3://other/p"}))
    assert refused.code == 403
    message = str(refused)
    assert message.startswith("spec.storage.uri: pods injected for an earlier "
                              "CheckpointPolicy llama still live (pod llama-0: running or "
                              "pending)")
    assert "restart the whole job together" in message
    assert str(refusal(body("llama", localTier={"path": "/mnt/ckptdrain/m"}))).startswith(
        "spec.localTier.path:")
    # A reason acknowledges the move, never a new writer count.
    admit(body("llama", storage={"uri": "s3://other/p"}, relocation={"reason": "migration"}))
    message = str(refusal(body("llama", writers=4, relocation={"reason": "migration"})))
    assert message.startswith("spec.writers:") and "suspend the job" in message
    # Pods of another policy, or no longer live, are no obstacle.
    cluster["pods"] = [pod_of(old, "llama-0", "Succeeded"), pod_of(body("x"), "x-0")]
    admit(body("llama", writers=4))


def test_an_unreadable_pod_list_refuses_with_503(
        cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    def slow(namespace: str, policy: str, wanted: Any, deadline: float) -> None:
        raise apiserver_reads.ReadFailed("listing the pods of ml took longer than an "
                                         "admission may wait")

    monkeypatch.setattr(apiserver_reads, "first_injected_pod", slow)
    refused = refusal(body("llama"))
    assert refused.code == 503 and "took longer" in str(refused)


def test_an_update_leaving_the_spec_alone_or_of_a_policy_being_deleted_is_admitted(
        cluster: dict[str, Any]) -> None:
    # Stored under a larger maximum than the one now configured: a spec
    # admission would refuse today.
    stored = body("llama", localTier={"path": "/etc"})
    labelled = {**stored, "metadata": {**stored["metadata"], "labels": {"team": "a"}}}
    admit(labelled, stored)  # kubectl label, a GitOps annotation
    going = {**stored, "metadata": {**stored["metadata"], "finalizers": [],
                                    "deletionTimestamp": "2026-11-29T08:00:00Z"}}
    admit(going, {**stored, "metadata": {**going["metadata"],
                                         "finalizers": ["foregroundDeletion"]}})
    assert cluster["reads"] == []
    # A spec change of the same stored policy is still checked.
    moved = body("llama", localTier={"path": "/etc"}, interval="20m")
    assert refusal(moved, stored).code == 422
