"""A class that allows namespaces by label where its policies are judged,
with the apiserver's reads replaced: labels that cannot be read are a
retry (503 at admission, a retried reconcile), never a judgement of the
policy; a namespace relabelled out of a class takes its policy's share of
the cluster cap away with no change to the policy."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import kopf
import pytest

from ckptdrain.operator import config, policy_reconcile
from ckptdrain.operator.admission import policy_rules
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.apiserver import class_view, namespace_labels
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.bandwidth import rebalance
from ckptdrain.operator.records import watchdog

LOG = logging.getLogger("test")
CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0",
                            cluster_bandwidth=100e6)
TEAM_A = {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
          "metadata": {"name": "team-a", "creationTimestamp": "2026-11-01T00:00:00Z",
                       "annotations": {"ckptdrain.io/is-default-class": "true"}},
          "spec": {"nodeTier": {"root": "/mnt/ckptdrain"},
                   "namespaces": {"from": "Selector",
                                  "selector": {"matchLabels": {"tenant": "a"}}}}}


def policy(namespace: str = "ml", name: str = "llama", cls: str | None = "team-a"
           ) -> dict[str, Any]:
    spec: dict[str, Any] = {"checkpointClassName": cls} if cls else {}
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "generation": 1},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "model": {"checkpointBytes": "900GB"}, "interval": "15m",
                     "localTier": {"path": "/mnt/ckptdrain/nvme"},
                     "storage": {"uri": "s3://bucket/prefix"}, **spec}}


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, no_checkpoint_classes: class_view.ClassView
            ) -> Iterator[dict[str, Any]]:
    """Each namespace's labels (a namespace missing answers 403: the RBAC
    rolled back), the namespace's policies, and the namespaces read."""
    state: dict[str, Any] = {"labels": {"ml": {"tenant": "a"}}, "policies": [], "read": []}
    no_checkpoint_classes.replace([TEAM_A], "1")

    def get_json(path: str, query: Any, timeout: float) -> dict[str, Any]:
        namespace = path.rsplit("/", 1)[1]
        state["read"].append(namespace)
        if namespace not in state["labels"]:
            raise apiserver_reads.ApiError(403, "Forbidden")
        return {"metadata": {"name": namespace, "labels": dict(state["labels"][namespace])}}

    monkeypatch.setattr(apiserver_reads, "get_json", get_json)
    monkeypatch.setattr(apiserver_reads, "list_policies",
                        lambda namespace, timeout=5: list(state["policies"]))
    monkeypatch.setattr(apiserver_reads, "first_injected_pod", lambda *a, **k: None)
    monkeypatch.setattr(apiserver_reads, "live_writers",
                        lambda namespace, name, rank, cached=False: [])
    namespace_labels.forget()
    yield state
    namespace_labels.forget()


def test_policy_admission_is_a_503_when_the_labels_cannot_be_read(
        cluster: dict[str, Any]) -> None:
    del cluster["labels"]["ml"]
    with pytest.raises(admission.Refused) as refused:
        asyncio.run(policy_rules.admit_policy(policy(), None, "ml", CFG))
    assert refused.value.code == 503
    assert str(refused.value).startswith("spec.checkpointClassName: could not read the labels "
                                         "of namespace ml, which its CheckpointClass allows "
                                         "by label (")


def test_the_default_class_patch_is_a_503_when_the_labels_cannot_be_read(
        cluster: dict[str, Any]) -> None:
    assert asyncio.run(policy_rules.default_class_patch(policy(cls=None), [], "ml")) == [
        {"op": "add", "path": "/spec/checkpointClassName", "value": "team-a"}]
    del cluster["labels"]["ml"]
    with pytest.raises(admission.Refused) as refused:
        asyncio.run(policy_rules.default_class_patch(policy(cls=None), [], "ml"))
    assert refused.value.code == 503


def test_a_pod_is_a_503_when_its_namespace_was_never_read_and_cannot_be(
        cluster: dict[str, Any]) -> None:
    cluster["policies"] = [policy()]
    del cluster["labels"]["ml"]
    pod = {"metadata": {"name": "w-0", "namespace": "ml",
                        "labels": {"app": "llama", "ckptdrain.io/inject": "true"}},
           "spec": {"containers": [{"name": "trainer", "image": "t"}]}}
    with pytest.raises(admission.Refused) as refused:
        asyncio.run(admission.admit_pod(pod, "ml", CFG, [], LOG, None, None))
    assert refused.value.code == 503 and "retry" in str(refused.value)


def test_a_reconcile_that_cannot_read_the_labels_retries_and_writes_nothing(
        cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[Any] = []
    monkeypatch.setattr(watchdog, "start", lambda *a, **k: None)
    monkeypatch.setattr(policy_reconcile, "write_status", lambda *a: written.append(a))
    del cluster["labels"]["ml"]
    body = policy()
    body["status"] = {"phase": "Ready", "conditions": [
        {"type": "ClassResolved", "status": "True", "reason": "Resolved",
         "message": "CheckpointClass team-a"}]}
    indexes: dict[str, Any] = {k: {} for k in (
        "pod_index", "checkpointpolicy_index", "checkpoint_index", "peer_pod_index",
        "progress_index")}
    with pytest.raises(kopf.TemporaryError, match="namespace ml"):
        policy_reconcile.reconcile_policy(body=kopf.Body(body),
                                          memo=kopf.Memo(config=CFG), logger=LOG,
                                          announce=False, **indexes)
    assert written == []  # no Invalid, no NamespaceNotAllowed: the status stands


def test_a_namespace_relabelled_out_of_the_class_loses_its_share(
        cluster: dict[str, Any]) -> None:
    cluster["labels"]["other"] = {"tenant": "a"}
    policies = {("ml", "a"): [policy("ml", "a")], ("other", "b"): [policy("other", "b")]}
    pods = {key: [object()] for key in policies}
    for namespace in ("ml", "other"):  # as each policy's reconcile reads them
        namespace_labels.recent(namespace, CFG.namespace_recheck_s)
    parts = rebalance.budgets(CFG, policies, pods)  # type: ignore[arg-type]
    assert set(parts) == {("ml", "a"), ("other", "b")}
    # Relabelled, as the recheck reads it: the same policies, another answer.
    cluster["labels"]["ml"] = {"tenant": "b"}
    namespace_labels.fresh("ml")
    parts = rebalance.budgets(CFG, policies, pods)  # type: ignore[arg-type]
    assert set(parts) == {("other", "b")}
    assert parts[("other", "b")][1].budget == pytest.approx(100e6)


def test_the_joint_pass_reads_no_labels_behind_its_locks(
        cluster: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # The apiserver times out: a read in the pass would hold the budgets'
    # lock for its timeout, once per namespace, for every waiting caller.
    def timing_out(path: str, query: Any, timeout: float) -> dict[str, Any]:
        cluster["read"].append(path)
        raise TimeoutError("timed out")

    policies = {("ml", "a"): [policy("ml", "a")], ("other", "b"): [policy("other", "b")]}
    pods = {key: [object()] for key in policies}
    cluster["labels"]["other"] = {"tenant": "a"}
    namespace_labels.fresh("other")  # held, as its reconcile or the recheck left it
    monkeypatch.setattr(apiserver_reads, "get_json", timing_out)
    cluster["read"].clear()
    parts = rebalance.budgets(CFG, policies, pods)  # type: ignore[arg-type]
    assert cluster["read"] == []
    # Never read: no share, as a failed read gave; a held reading counts.
    assert set(parts) == {("other", "b")}
    # The policy's own reconcile reads (it may, outside the pass's locks),
    # and its reading moves the pass's memo.
    monkeypatch.setattr(apiserver_reads, "get_json", lambda path, query, timeout: {
        "metadata": {"name": "ml", "labels": {"tenant": "a"}}})
    assert rebalance.parse_policy(CFG, policy("ml", "a"), 1).name == "a"
    parts = rebalance.budgets(CFG, policies, pods)  # type: ignore[arg-type]
    assert set(parts) == {("ml", "a"), ("other", "b")}
