"""operator/admission/rules.py's writer identity step and policy look-up (and the Kopf
side's indexes), with the two API reads (owners, live holders of a rank) replaced."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptdrain.operator import config
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission import webhook
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.policy import spec as policy

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")


def parsed(writers: int, **extra: Any) -> policy.Policy:
    return policy.parse("ml", "llama", {
        "selector": {"matchLabels": {"app": "t"}}, "model": {"parameters": "7B"},
        "interval": "10m", "writers": writers, "localTier": {"path": "/mnt/ckptdrain/n"},
        "storage": {"uri": "s3://bucket/p"}, **extra}, CFG)


def job_pod(index: int, name: str = "w") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml",
                         "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                              "name": "train", "controller": True}]}}


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    state: dict[str, Any] = {"holders": [], "reads": [], "fail": None, "lists": []}

    def read_object(api_version: str, plural: str, namespace: str, name: str) -> Any:
        state["reads"].append((api_version, plural, name))
        return {"spec": {"completions": 3}} if plural == "jobs" else None

    def live_writers(namespace: str, name: str, rank: int, cached: bool = False) -> list[str]:
        state["lists"].append("cache" if cached else "fresh")
        if state["fail"] is not None:
            raise state["fail"]
        if cached and "cached_holders" in state:
            return list(state["cached_holders"])
        return list(state["holders"])

    monkeypatch.setattr(apiserver_reads, "read_object", read_object)
    monkeypatch.setattr(apiserver_reads, "live_writers", live_writers)
    return state


def identify(pod: dict[str, Any], writers: int, **extra: Any) -> tuple[Any, list[str]]:
    warnings: list[str] = []
    found = asyncio.run(admission.pod_role(pod, "ml", parsed(writers, **extra), warnings))
    return found, warnings


def test_rank_and_count_come_from_the_pod_and_its_job(api: dict[str, Any]) -> None:
    found, warnings = identify(job_pod(2), 4)
    assert (found.reader, found.shard, found.workload_writers) == (False, 2, 3)
    assert api["reads"] == [("batch/v1", "jobs", "train")]
    assert warnings == ["ckptdrain: policy llama: spec.writers is 4 but the Job has 3 pods "
                        "that write; the checkpoint is complete only when 4 writers "
                        "committed it"]


def test_a_live_holder_refuses_the_pod_naming_both(api: dict[str, Any]) -> None:
    api["holders"] = ["w-old"]
    with pytest.raises(admission.Refused, match=r"pod w-new .* claims writer 1 of policy "
                       r"llama, which live pod w-old already holds"):
        identify(job_pod(1, "w-new"), 3)
    api["holders"] = ["w-new"]  # itself (a retried admission) is no conflict
    assert identify(job_pod(1, "w-new"), 3)[0].shard == 1


def test_an_unchecked_rank_is_refused_not_trusted(api: dict[str, Any]) -> None:
    api["fail"] = apiserver_reads.ApiError(500, "etcd leader changed")
    with pytest.raises(admission.Refused, match="could not check whether a live pod "
                       "already holds writer 1"):
        identify(job_pod(1), 3)


def test_no_rank_is_fine_only_with_one_writer(api: dict[str, Any]) -> None:
    plain = {"metadata": {"name": "solo", "namespace": "ml"}}
    assert identify(plain, 1)[0].shard is None
    with pytest.raises(admission.Refused, match=r"pod solo \(Pod\) has no writer rank"):
        identify(plain, 2)
    generated = {"metadata": {"generateName": "train-", "namespace": "ml"}}
    with pytest.raises(admission.Refused, match=r"pod train-<generated> \(Pod\)"):
        identify(generated, 2)


def test_a_rank_past_writers_is_refused_unless_readers_are_declared(
        api: dict[str, Any]) -> None:
    with pytest.raises(admission.Refused, match=r"rank 5 .* is not below spec.writers \(4\); "
                       r"a pod that only restores is a reader: annotate it "
                       r"ckptdrain.io/role: reader, or set spec.readers: Replicas"):
        identify(job_pod(5), 4)
    api["fail"] = AssertionError("a reader's rank was looked up among the writers")
    found, _ = identify(job_pod(5), 4, readers="Replicas")
    assert (found.reader, found.shard) == (True, 1)
    reader = job_pod(2)
    reader["metadata"]["annotations"]["ckptdrain.io/role"] = "reader"
    found, _ = identify(reader, 4)  # declared by the workload: a reader at any rank
    assert (found.reader, found.shard, found.readers_alongside) == (True, 2, True)


def test_replicas_make_a_job_of_two_replicas_consistent_and_tell_its_writers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptdrain.operator.admission.owner_cache import OwnerCache

    job = {"spec": {"completions": 8}}
    monkeypatch.setattr(apiserver_reads, "read_object", lambda *_: job)
    monkeypatch.setattr(apiserver_reads, "live_writers", lambda *_: [])
    for completions, counted, warned in ((8, 4, False), (6, 6, True), (4, 4, False)):
        job["spec"]["completions"] = completions
        monkeypatch.setattr(admission, "_owner_objects",
                            OwnerCache(lambda *ref: apiserver_reads.read_object(*ref)))
        found, warnings = identify(job_pod(1), 4, readers="Replicas")
        assert (found.reader, found.workload_writers) == (False, counted)
        # Its readers restore beside it only when the Job runs more pods than writers.
        assert found.readers_alongside == (completions > 4)
        assert bool(warnings) == warned
        assert not warned or "not a whole number of data-parallel replicas" in warnings[0]


def test_a_declared_writer_past_writers_and_a_bad_role_are_refused(api: dict[str, Any]) -> None:
    writer = job_pod(4)
    writer["metadata"]["annotations"]["ckptdrain.io/role"] = "writer"
    with pytest.raises(admission.Refused, match=r"declares ckptdrain\.io/role: writer"):
        identify(writer, 4, readers="Replicas")
    odd = job_pod(0)
    odd["metadata"]["annotations"]["ckptdrain.io/role"] = "Reader"
    with pytest.raises(admission.Refused, match=r"annotation ckptdrain\.io/role: expected "
                       r"'writer' or 'reader', got 'Reader'"):
        identify(odd, 4)


def test_the_operators_pod_index_answers_without_an_api_call(api: dict[str, Any]) -> None:
    """With the active replica's pod index, a rank's holders cost no list of
    every pod in the namespace (which grows with the job at each admission)."""
    from ckptdrain.operator.policy.allocation import DrainingPod

    api["fail"] = AssertionError("the apiserver was asked")
    index = {("ml", "llama"): [
        DrainingPod("w-old", None, writer="1"),
        DrainingPod("w-going", None, writer="2", deleting=True),
        DrainingPod("w-other", None, writer="0")]}
    holders = webhook._indexed_holders(index, "ml", "llama")  # type: ignore[arg-type]
    found = asyncio.run(admission.pod_role(job_pod(2, "w-new"), "ml", parsed(3), [],
                                                holders))
    assert found.shard == 2  # a pod being deleted holds nothing
    # The index names a holder: the apiserver has the last word.
    api["fail"] = None
    api["holders"] = ["w-old"]
    with pytest.raises(admission.Refused, match="which live pod w-old already holds"):
        asyncio.run(admission.pod_role(job_pod(1, "w-new"), "ml", parsed(3), [],
                                            holders))
    api["holders"] = []  # deleted a moment ago, still in the index: admitted
    found = asyncio.run(admission.pod_role(job_pod(1, "w-new"), "ml", parsed(3), [],
                                                holders))
    assert found.shard == 1


def _filed(bodies: list[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    """What Kopf's policy_by_label index holds for these policies."""
    index: dict[Any, list[dict[str, Any]]] = {}
    for body in bodies:
        key = admission.label_key(body["metadata"]["namespace"], body["spec"].get("selector"))
        index.setdefault(key, []).append(body)
    return index


def _policy(name: str, selector: dict[str, Any], namespace: str = "ml") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"selector": selector}}


def test_admission_reads_only_the_policies_that_could_select_the_pod() -> None:
    many = [_policy(f"p{i}", {"matchLabels": {"app": f"p{i}"}}) for i in range(1000)]
    wide = _policy("any-gpu", {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]})
    other = _policy("p7", {"matchLabels": {"app": "p7"}}, namespace="elsewhere")
    index = _filed([*many, wide, other])
    found = webhook._candidates("ml", {"app": "p7", "team": "x"}, index)  # type: ignore[arg-type]
    assert sorted(b["metadata"]["name"] for b in found) == ["any-gpu", "p7"]
    assert admission._selecting({"app": "p7"}, found) == [many[7]]


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.dictionaries(st.sampled_from("abc"), st.sampled_from("xy"), max_size=3),
                max_size=8),
       st.dictionaries(st.sampled_from("abcd"), st.sampled_from("xyz"), max_size=4))
def test_the_label_index_finds_exactly_what_a_scan_of_every_policy_finds(
        selectors: list[dict[str, str]], labels: dict[str, str]) -> None:
    bodies = [_policy(f"p{i}", {"matchLabels": s} if s else {}) for i, s in enumerate(selectors)]
    scanned = admission._selecting(labels, bodies)
    indexed = admission._selecting(labels, webhook._candidates(
        "ml", labels, _filed(bodies)))  # type: ignore[arg-type]
    assert indexed == scanned


def test_a_job_of_many_pods_reads_its_job_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptdrain.operator.admission.owner_cache import OwnerCache

    reads: list[str] = []

    def read_object(api_version: str, plural: str, namespace: str, name: str) -> Any:
        reads.append(plural)
        return {"metadata": {"name": name, "uid": "job-uid"}, "spec": {"completions": 8}}

    monkeypatch.setattr(apiserver_reads, "read_object", read_object)
    monkeypatch.setattr(apiserver_reads, "live_writers", lambda *_: [])
    monkeypatch.setattr(admission, "_owner_objects",
                        OwnerCache(lambda *ref: apiserver_reads.read_object(*ref)))
    for rank in range(8):
        pod = job_pod(rank, f"w-{rank}")
        pod["metadata"]["ownerReferences"][0]["uid"] = "job-uid"
        found, _ = identify(pod, 8)
        assert (found.shard, found.workload_writers) == (rank, 8)
    assert reads == ["jobs"]


def test_owners_kept_or_absent_need_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod with no controller, or whose Job (and JobSet) are kept, is
    admitted without a hop to a thread for its owners."""
    from ckptdrain.operator.admission.owner_cache import OwnerCache

    objects = {
        "jobs": {"metadata": {"name": "train-0", "uid": "job-uid", "ownerReferences": [
            {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "train",
             "uid": "js-uid", "controller": True}]}, "spec": {"completions": 4}},
        "jobsets": {"metadata": {"name": "train", "uid": "js-uid"}, "spec": {}},
    }
    reads: list[str] = []

    def read_object(api_version: str, plural: str, namespace: str, name: str) -> Any:
        reads.append(plural)
        return objects[plural]

    hops: list[str] = []
    real_to_thread = asyncio.to_thread

    async def to_thread(func: Any, *args: Any) -> Any:
        hops.append(func.__name__)
        return await real_to_thread(func, *args)

    monkeypatch.setattr(apiserver_reads, "read_object", read_object)
    monkeypatch.setattr(apiserver_reads, "live_writers", lambda *_: [])
    monkeypatch.setattr(admission.asyncio, "to_thread", to_thread)
    monkeypatch.setattr(admission, "_owner_objects",
                        OwnerCache(lambda *ref: apiserver_reads.read_object(*ref)))

    def owned(rank: int) -> dict[str, Any]:
        pod = job_pod(rank, f"w-{rank}")
        pod["metadata"]["ownerReferences"][0]["uid"] = "job-uid"
        return pod

    first = admission._owners_known("ml", owned(0))
    assert first is None  # nothing kept yet: the owners must be read
    assert admission._owners("ml", owned(0)).jobset == objects["jobsets"]
    assert reads == ["jobs", "jobsets"]
    known = admission._owners_known("ml", owned(1))
    assert known is not None and known.job == objects["jobs"]
    assert known.jobset == objects["jobsets"]
    bare = job_pod(2, "w-2")
    bare["metadata"].pop("ownerReferences")
    assert admission._owners_known("ml", bare) == admission._owners("ml", bare)
    for rank in range(1, 4):
        identify(owned(rank), 4)
    assert "_owners" not in hops and reads == ["jobs", "jobsets"]


def test_without_an_index_the_watch_cache_is_asked_first_and_a_refusal_rests_on_a_fresh_read(
        api: dict[str, Any]) -> None:
    found = asyncio.run(admission.pod_role(job_pod(1, "w-new"), "ml", parsed(3), []))
    assert found.shard == 1
    assert api["lists"] == ["cache"]  # nobody holds it: one look, no read of etcd
    api["lists"].clear()
    api["cached_holders"] = ["w-old"]  # the cache still has a pod deleted a moment ago
    found = asyncio.run(admission.pod_role(job_pod(1, "w-new"), "ml", parsed(3), []))
    assert found.shard == 1 and api["lists"] == ["cache", "fresh"]
    api["lists"].clear()
    api["holders"] = ["w-old"]
    with pytest.raises(admission.Refused, match="which live pod w-old already holds"):
        asyncio.run(admission.pod_role(job_pod(1, "w-new"), "ml", parsed(3), []))
    assert api["lists"] == ["cache", "fresh"]
