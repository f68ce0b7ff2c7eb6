"""A class that allows namespaces by label where its policies are judged,
with the apiserver's reads replaced: labels that cannot be read are a
retry (503 at admission, a retried reconcile), never a judgement of the
policy; a namespace relabelled out of a class takes its policy's share of
the cluster cap away with no change to the policy."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from tests.support.tenancy_wiring import CFG, LOG, fake_cluster, policy

from ckptdrain.operator import policy_reconcile
from ckptdrain.operator.admission import policy_rules
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.apiserver import class_view, namespace_labels
from ckptdrain.operator.bandwidth import rebalance
from ckptdrain.operator.records import watchdog


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, no_checkpoint_classes: class_view.ClassView
            ) -> Iterator[dict[str, Any]]:
    yield from fake_cluster(monkeypatch, no_checkpoint_classes)


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


def test_after_a_new_term_the_first_policy_reconciled_does_not_take_the_whole_cap(
        cluster: dict[str, Any]) -> None:
    # A new term (or a start) forgets every reading; the first policy
    # reconciled reads its own namespace, and the budgets (on the leading
    # replica) read, within one read's timeout, those holding no reading.
    cluster["labels"]["other"] = {"tenant": "a"}
    policies = {("ml", "a"): [policy("ml", "a")], ("other", "b"): [policy("other", "b")]}
    pods = {key: [object()] for key in policies}
    namespace_labels.forget()
    assert rebalance.parse_policy(CFG, policy("ml", "a"), 1).name == "a"
    parts = rebalance.budgets(CFG, policies, pods)  # type: ignore[arg-type]
    assert set(parts) == {("ml", "a"), ("other", "b")}
    assert [parts[key][1].budget for key in sorted(parts)] == pytest.approx([50e6, 50e6])
