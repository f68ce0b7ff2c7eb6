"""How the CheckpointClasses are read where a decision needs them: without
the CRD (404, or 403 while RBAC lags) the answer "no classes" is kept and
asked again only at an interval, logged once; a read that gets no answer
refuses the pod or policy with a message naming the field and the kind; an
event older than the body held is skipped."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import policy_rules
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.apiserver import class_view
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.bandwidth import rebalance
from ckptdrain.operator.policy import classes

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain", image="ckptdrain:1.0")
LOG = logging.getLogger("test")


def own_policy(name: str = "llama") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "generation": 1, "uid": f"uid-{name}"},
            "spec": {"selector": {"matchLabels": {"app": name}}, "model": {"parameters": "7B"},
                     "interval": "10m", "localTier": {"path": "/mnt/ckptdrain/n"},
                     "storage": {"uri": "s3://ckpt/ml/runs",
                                 "credentialsSecretRef": {"name": "s3"}}}}


def opted_in() -> dict[str, Any]:
    return {"metadata": {"name": "w-0", "namespace": "ml",
                         "labels": {"app": "llama", "ckptdrain.io/inject": "true"}},
            "spec": {"containers": [{"name": "trainer", "image": "t"}],
                     "terminationGracePeriodSeconds": 3600}}


@pytest.fixture
def class_lists(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every read of the apiserver answers `state["status"]` (an ApiError),
    counting the LISTs of CheckpointClasses."""
    state: dict[str, Any] = {"lists": 0, "status": 404}

    def answer(path: str, *_: Any, **__: Any) -> Any:
        if path == class_view.PATH:
            state["lists"] += 1
        raise apiserver_reads.ApiError(state["status"], "no")
    monkeypatch.setattr(apiserver_reads, "get_json", answer)
    monkeypatch.setattr(apiserver_reads, "list_policies", lambda ns, timeout=5: [own_policy()])
    monkeypatch.setattr(apiserver_reads, "first_injected_pod", lambda *a, **k: None)
    monkeypatch.setattr(apiserver_reads, "live_writers", lambda *a, **k: [])
    class_view.CLASSES.lost()  # as after an upgrade whose CRDs lag
    return state


@pytest.mark.parametrize("status", [404, 403])
def test_without_the_crd_decisions_list_classes_once_per_interval(
        class_lists: dict[str, Any], status: int, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    class_lists["status"] = status
    for _ in range(20):
        ops = asyncio.run(admission.admit_pod(opted_in(), "ml", CFG, [], LOG,
                                              [own_policy()], None))
        assert ops  # injected under the operator's own settings
    first = rebalance.class_condition(CFG, own_policy())
    assert first["reason"] == classes.NO_CLASS
    assert class_lists["lists"] == 1
    said = [r for r in caplog.records if "CheckpointClass CRD cannot be read" in r.message]
    assert len(said) == 1
    # The interval passed: asked once more, and not said again.
    later = class_view.time.monotonic() + class_view.CRD_RECHECK_S + 1
    monkeypatch.setattr(class_view.time, "monotonic", lambda: later)
    for _ in range(5):
        rebalance.class_condition(CFG, own_policy())
    assert class_lists["lists"] == 2
    assert len([r for r in caplog.records
                if "CheckpointClass CRD cannot be read" in r.message]) == 1


def test_without_the_crd_the_budgets_memo_is_kept(class_lists: dict[str, Any],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config.OperatorConfig(allowed_root="/mnt/ckptdrain", cluster_bandwidth=100e6)
    policies = {("ml", f"p{i}"): [own_policy(f"p{i}")] for i in range(5)}
    pods = {key: [object()] for key in policies}
    parsed = {"n": 0}
    parse = rebalance.parse_policy

    def counting(*args: Any, **kwargs: Any) -> Any:
        parsed["n"] += 1
        return parse(*args, **kwargs)
    monkeypatch.setattr(rebalance, "parse_policy", counting)
    for _ in range(4):
        rebalance.budgets(cfg, policies, pods)
    assert class_lists["lists"] == 1
    assert parsed["n"] == 5  # each policy once: the memo outlived the calls


def test_a_class_event_after_no_crd_makes_the_view_list_again(
        class_lists: dict[str, Any]) -> None:
    rebalance.class_condition(CFG, own_policy())
    assert class_view.CLASSES.absent
    class_view.CLASSES.apply("ADDED", {"metadata": {"name": "std", "resourceVersion": "5"},
                                       "spec": {"nodeTier": {"root": "/mnt/nvme"}}})
    assert not class_view.CLASSES.absent and not class_view.CLASSES.current


def test_an_unanswered_class_read_refuses_the_pod_naming_field_and_kind(
        class_lists: dict[str, Any]) -> None:
    class_lists["status"] = 500
    with pytest.raises(admission.Refused) as refused:
        asyncio.run(admission.admit_pod(opted_in(), "ml", CFG, [], LOG, [own_policy()], None))
    assert refused.value.code == 503
    assert classes.CLASS_FIELD in str(refused.value)
    assert "CheckpointClasses" in str(refused.value)


def test_policy_admission_reads_classes_within_its_one_deadline(
        class_lists: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, float] = {}

    def listing(path: str, params: Any, timeout: float) -> Any:
        seen["classes"] = timeout
        class_view.time.sleep(0.5)  # a slow apiserver
        return {"items": [], "metadata": {"resourceVersion": "1"}}

    def policies(namespace: str, timeout: float = 5) -> list[dict[str, Any]]:
        seen["policies"] = timeout
        return []
    monkeypatch.setattr(apiserver_reads, "get_json", listing)
    monkeypatch.setattr(apiserver_reads, "list_policies", policies)
    asyncio.run(policy_rules.admit_policy(own_policy(), None, "ml", CFG))
    budget = apiserver_reads.ADMISSION_READ_TIMEOUT_S
    assert 0 < seen["classes"] <= budget
    # The time the classes took is gone from the next read's budget.
    assert seen["policies"] <= budget - 0.5


def test_an_event_older_than_the_body_held_is_skipped() -> None:
    view = class_view.ClassView()
    newer = {"metadata": {"name": "std", "resourceVersion": "20"},
             "spec": {"nodeTier": {"root": "/mnt/new"}}}
    older = {"metadata": {"name": "std", "resourceVersion": "9"},
             "spec": {"nodeTier": {"root": "/mnt/old"}}}
    view.replace([newer], "20")
    view.apply("MODIFIED", older)
    found = view.made(classes.catalogue)
    assert found is not None and found["std"].root == "/mnt/new"


def test_the_views_thread_waits_for_the_crd_quietly_then_watches_it(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import contextlib
    import threading

    answers: list[Any] = [apiserver_reads.ApiError(404, "no")] * 3 + [
        {"items": [{"metadata": {"name": "std", "resourceVersion": "7"},
                    "spec": {"nodeTier": {"root": "/mnt/nvme"}}}],
         "metadata": {"resourceVersion": "7"}}]
    watched: list[str] = []
    stopping = threading.Event()

    def listing(*_: Any, **__: Any) -> Any:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    @contextlib.contextmanager
    def watching(path: str, query: Any, version: str, *_: Any) -> Any:
        watched.append(version)
        stopping.set()
        yield iter(())
    monkeypatch.setattr(apiserver_reads, "get_json", listing)
    monkeypatch.setattr(apiserver_reads, "watching", watching)
    monkeypatch.setattr(class_view, "CRD_RECHECK_S", 0.05)
    view = class_view.ClassView()
    class_view.start(LOG, view, stopping).join(5)
    assert watched == ["7"]  # watched only once the CRD was there
    found = view.made(classes.catalogue)
    assert found is not None and list(found) == ["std"] and not view.absent
    assert len([r for r in caplog.records
                if "CheckpointClass CRD cannot be read" in r.message]) == 1
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
