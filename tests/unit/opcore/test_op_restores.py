"""operator/records/restores.py: a burst of restores is one status patch per policy;
a pod's restore is noted once; a failed patch loses nothing."""

from __future__ import annotations

from typing import Any

import pytest

from ckptdrain.operator.records import restores

KEY = ("ns", "llama")


@pytest.fixture()
def patches(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(restores.kube, "patch_status",
                        lambda plural, ns, name, change: sent.append(change) or True)
    restores._seen.clear()
    restores._new.clear()
    restores._written.clear()
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
                        lambda plural, ns, name, change: patches.append(change) or True)
    restores.record(KEY, {"status": {}})
    assert [r["pod"] for r in patches[0]["restores"]] == ["w-0"]


def test_a_deleted_policy_forgets_its_unrecorded_restores(
        patches: list[dict[str, Any]]) -> None:
    restores.observe(KEY, "u", "w-0", "s3://b/p/step-9", False, "t1")
    restores.forget(KEY)
    restores.record(KEY, {"status": {}})
    assert patches == []


def test_a_pass_reading_a_stale_index_keeps_what_the_last_pass_wrote(
        patches: list[dict[str, Any]]) -> None:
    restores.observe(KEY, "a", "w-a", "s3://b/p/step-9", False, "t1")
    restores.record(KEY, {"status": {}})
    restores.observe(KEY, "c", "w-c", "s3://b/p/step-9", False, "t2")
    restores.record(KEY, {"status": {}})  # the index has not seen the first patch
    assert [r["pod"] for r in patches[-1]["restores"]] == ["w-c", "w-a"]


def test_restores_in_one_second_keep_the_newest_noted(patches: list[dict[str, Any]]) -> None:
    for i in range(30):
        restores.observe(KEY, f"u{i}", f"w-{i}", "local", False, "2026-11-26T10:00:00Z")
    restores.record(KEY, {"status": {}})
    assert [r["pod"] for r in patches[0]["restores"]][:2] == ["w-29", "w-28"]


def test_restores_of_a_policy_not_there_are_dropped(patches: list[dict[str, Any]]) -> None:
    restores.observe(KEY, "u", "w-0", "local", False, "t1")
    restores.record(KEY, None)
    assert KEY not in restores._new
    restores.record(KEY, {"status": {}})
    assert patches == []
