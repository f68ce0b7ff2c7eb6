"""The startup handler's settings: pods are listed and watched by a
server-side label selector (only opted-in pods reach the operator), and the
peering priority is the one leadership.py compares."""

from __future__ import annotations

import logging
from typing import Any

import kopf
import pytest
from kopf._cogs.structs import references

from ckptdrain.operator import handlers
from ckptdrain.operator.apiserver import class_view, leadership
from ckptdrain.operator.config import OperatorConfig

PODS = references.Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
POLICIES = references.Resource(group="ckptdrain.io", version="v1beta1",
                               plural="checkpointpolicies", kind="CheckpointPolicy",
                               namespaced=True)


@pytest.fixture(autouse=True)
def no_class_thread(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The startup's thread that keeps the process's class view would,
    with no apiserver, keep emptying the view other tests file classes in."""
    started: list[Any] = []
    monkeypatch.setattr(class_view, "start", lambda *args, **kwargs: started.append(args))
    return started


def test_pods_are_selected_server_side_and_priority_is_shared() -> None:
    settings = kopf.OperatorSettings()
    settings.peering.standalone = True  # no peering reads from a unit test
    handlers.operator_startup(settings=settings,
                              memo=kopf.Memo(config=OperatorConfig(webhook_port=0)),
                              logger=logging.getLogger("test"))
    assert list(settings.watching.label_selectors.collect(PODS)) == ["ckptdrain.io/inject=true"]
    assert list(settings.watching.label_selectors.collect(POLICIES)) == []
    assert settings.peering.priority == leadership.PRIORITY
    assert leadership.active()  # standalone: always the one that reconciles


def test_pods_get_no_diff_base_and_need_none() -> None:
    """Kopf copies each object twice per event to build its diff base; pods
    skip it, which is right only while no create/update/resume handler
    watches pods."""
    settings = kopf.OperatorSettings()
    settings.peering.standalone = True
    handlers.operator_startup(settings=settings,
                              memo=kopf.Memo(config=OperatorConfig(webhook_port=0)),
                              logger=logging.getLogger("test"))
    storage = settings.persistence.diffbase_storage
    registry = kopf.get_default_registry()
    assert not registry._changing.has_handlers(resource=PODS)
    assert registry._changing.has_handlers(resource=POLICIES)  # the check can see some
    pod = kopf.Body({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                     "spec": {"containers": [{"name": "trainer"}]}})
    assert storage.build(body=pod) == {}
    policy = kopf.Body({"apiVersion": "ckptdrain.io/v1alpha1", "kind": "CheckpointPolicy",
                        "metadata": {"name": "p"}, "spec": {"interval": "15m"}})
    assert storage.build(body=policy) == {"spec": {"interval": "15m"}}


def test_no_cap_on_kopf_object_workers() -> None:
    """Workers wait for one another until everything present is indexed: a
    cap below the objects present hangs a restarted operator
    (tests/cluster/test_records.py shows it with 150 pods)."""
    settings = kopf.OperatorSettings()
    settings.peering.standalone = True
    handlers.operator_startup(settings=settings,
                              memo=kopf.Memo(config=OperatorConfig(webhook_port=0)),
                              logger=logging.getLogger("test"))
    assert settings.queueing.worker_limit is None
    assert settings.queueing.idle_timeout == handlers.IDLE_WORKER_S < 1
