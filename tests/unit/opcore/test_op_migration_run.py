"""One pass of the storage version migration against fake API clients
(migration/run.py): how each answer of a rewrite counts, and that the trim
is asked only after a pass that settled every object, at the CRD's
resourceVersion read after it."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from ckptdrain.operator.migration import plan, run

STORAGE_HASH = plan.storage_version_hash("ckptdrain.io", "v1beta1", "CheckpointPolicy")


def _crd(stored: list[str], resource_version: str) -> dict[str, Any]:
    return {"metadata": {"generation": 2, "resourceVersion": resource_version},
            "spec": {"versions": [{"name": "v1alpha1", "storage": False},
                                  {"name": "v1beta1", "storage": True}]},
            "status": {"storedVersions": stored}}


class FakeCrds:
    def __init__(self, stored: list[str], trim_answer: int = 200) -> None:
        self.reads = [_crd(stored, "10"), _crd(stored, "11")]
        self.trims: list[dict[str, Any]] = []
        self.trim_answer = trim_answer

    def read_custom_resource_definition(self, name: str, **_: Any) -> Any:
        body = self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]
        return SimpleNamespace(data=json.dumps(body).encode())

    def patch_custom_resource_definition_status(self, name: str, body: dict[str, Any],
                                                **_: Any) -> None:
        self.trims.append(body)
        if self.trim_answer != 200:
            raise ApiException(status=self.trim_answer, reason="test")


class FakeCustom:
    def __init__(self, answers: dict[str, int], served_hash: str = STORAGE_HASH) -> None:
        self.answers, self.served_hash = answers, served_hash
        self.rewrites: list[tuple[str, dict[str, Any]]] = []

    def get_api_resources(self, group: str, version: str, **_: Any) -> Any:
        return SimpleNamespace(resources=[SimpleNamespace(
            name="checkpointpolicies", storage_version_hash=self.served_hash)])

    def list_cluster_custom_object(self, group: str, version: str, plural: str,
                                   _continue: str | None = None, **_: Any) -> dict[str, Any]:
        names = sorted(self.answers)
        page = names[:2] if _continue is None else names[2:]
        return {"items": [{"metadata": {"namespace": "ml", "name": n, "resourceVersion": "5"}}
                          for n in page],
                "metadata": {"continue": "next" if _continue is None and names[2:] else ""}}

    def patch_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                       plural: str, name: str, body: dict[str, Any],
                                       **_: Any) -> None:
        assert version == "v1beta1"
        self.rewrites.append((name, body))
        status = self.answers[name]
        if status != 200:
            raise ApiException(status=status, reason="test")


def _pass(monkeypatch: pytest.MonkeyPatch, crds: FakeCrds, custom: FakeCustom) -> bool:
    monkeypatch.setattr(run, "_apis", lambda: (crds, custom))
    return run.migrate_once(0.0, served_since={})


def test_every_object_rewritten_or_raced_then_the_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    crds = FakeCrds(["v1alpha1", "v1beta1"])
    custom = FakeCustom({"a": 200, "b": 409, "c": 404})  # two pages
    assert _pass(monkeypatch, crds, custom)
    # Each written back unchanged: only the resourceVersion it was listed at.
    assert custom.rewrites == [(n, {"metadata": {"resourceVersion": "5"}}) for n in "abc"]
    assert crds.trims == [{"metadata": {"resourceVersion": "11"},
                           "status": {"storedVersions": ["v1beta1"]}}]


def test_a_failed_rewrite_keeps_the_old_version(monkeypatch: pytest.MonkeyPatch) -> None:
    crds = FakeCrds(["v1alpha1", "v1beta1"])
    assert not _pass(monkeypatch, crds, FakeCustom({"a": 200, "b": 500}))
    assert crds.trims == []


def test_nothing_is_rewritten_before_the_apiserver_serves_the_new_storage_version(
        monkeypatch: pytest.MonkeyPatch) -> None:
    crds = FakeCrds(["v1alpha1", "v1beta1"])
    custom = FakeCustom({"a": 200}, served_hash="stale")
    assert not _pass(monkeypatch, crds, custom)
    assert custom.rewrites == [] and crds.trims == []


def test_a_migrated_crd_costs_one_read(monkeypatch: pytest.MonkeyPatch) -> None:
    crds = FakeCrds(["v1beta1"])
    custom = FakeCustom({"a": 200})
    assert _pass(monkeypatch, crds, custom)
    assert custom.rewrites == [] and crds.trims == []


def test_nothing_is_listed_until_discovery_showed_the_version_for_the_settle_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    since: dict[tuple[str, int], float] = {}
    custom = FakeCustom({"a": 200})
    monkeypatch.setattr(run, "_apis", lambda: (FakeCrds(["v1alpha1", "v1beta1"]), custom))
    assert not run.migrate_once(60.0, clock=lambda: now[0], served_since=since)
    now[0] += 59.0
    assert not run.migrate_once(60.0, clock=lambda: now[0], served_since=since)
    assert custom.rewrites == []  # counted from the first pass that saw it served
    now[0] += 1.0
    crds = FakeCrds(["v1alpha1", "v1beta1"])
    monkeypatch.setattr(run, "_apis", lambda: (crds, custom))
    assert run.migrate_once(60.0, clock=lambda: now[0], served_since=since)
    assert [name for name, _ in custom.rewrites] == ["a"] and len(crds.trims) == 1


def test_a_trim_raced_by_another_replica_is_said_at_info_and_passed_again(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    crds = FakeCrds(["v1alpha1", "v1beta1"], trim_answer=409)
    caplog.set_level("INFO", logger=run.__name__)
    assert not _pass(monkeypatch, crds, FakeCustom({"a": 200}))
    raced = [r for r in caplog.records if "changed before the trim" in r.getMessage()]
    assert [r.levelname for r in raced] == ["INFO"]
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_another_refusal_of_the_trim_raises_for_the_retry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ApiException):
        _pass(monkeypatch, FakeCrds(["v1alpha1", "v1beta1"], trim_answer=403),
              FakeCustom({"a": 200}))
