"""operator/restores.py: a burst of restores is one status patch per policy;
a pod's restore is noted once; a failed patch loses nothing."""

from __future__ import annotations

from typing import Any

import pytest

from ckptdrain.operator import restores

KEY = ("ns", "llama")


@pytest.fixture()
def patches(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(restores.kube, "patch_status",
                        lambda plural, ns, name, change: sent.append(change))
    restores._seen.clear()
    restores._new.clear()
    return sent


def test_a_burst_of_restores_is_one_patch_with_the_newest_first(
        patches: list[dict[str, Any]]) -> None:
    for i in range(30):
        assert restores.observe(KEY, f"uid-{i}", f"w-{i}", "s3://b/p/step-40", False,
                                f"2026-11-26T10:00:{i:02d}Z")
    restores.record(KEY, {"status": {"restores": [{"pod": "old", "source": "x"}]}})
    (change,) = patches
    listed = change["restores"]
    assert len(listed) == restores.MAX_RESTORES
    assert [r["pod"] for r in listed[:3]] == ["w-29", "w-28", "w-27"]
    restores.record(KEY, {"status": change})  # nothing new: no patch
    assert len(patches) == 1


def test_each_pod_is_noted_once_until_it_goes(patches: list[dict[str, Any]]) -> None:
    assert restores.observe(KEY, "u", "w-0", "local:step-7", False, "t1")
    assert not restores.observe(KEY, "u", "w-0", "local:step-7", False, "t2")
    assert not restores.observe(KEY, "u", "w-0", None, False, "t3")
    assert not restores.observe(KEY, "u", "w-0", "local:step-7", True, "t4")
    assert restores.observe(KEY, "u", "w-0", "local:step-7", False, "t5")  # back again


def test_a_failed_patch_keeps_the_restores_for_the_retry(
        monkeypatch: pytest.MonkeyPatch, patches: list[dict[str, Any]]) -> None:
    restores.observe(KEY, "u", "w-0", "s3://b/p/step-9", False, "t1")

    def refuse(*_: Any) -> None:
        raise ConnectionError("apiserver away")

    monkeypatch.setattr(restores.kube, "patch_status", refuse)
    with pytest.raises(ConnectionError):
        restores.record(KEY, {"status": {}})
    monkeypatch.setattr(restores.kube, "patch_status",
                        lambda plural, ns, name, change: patches.append(change))
    restores.record(KEY, {"status": {}})
    assert [r["pod"] for r in patches[0]["restores"]] == ["w-0"]


def test_a_deleted_policy_forgets_its_unrecorded_restores(
        patches: list[dict[str, Any]]) -> None:
    restores.observe(KEY, "u", "w-0", "s3://b/p/step-9", False, "t1")
    restores.forget(KEY)
    restores.record(KEY, {"status": {}})
    assert patches == []
