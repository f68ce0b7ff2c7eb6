"""operator/admission/holder_mirror.py: the admission process's view of which pods hold
which writer rank, fed by list and watch events, and how admission uses it
(no API read when it names no holder; a fresh read before any refusal;
the apiserver asked whenever the view is not current)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from ckptdrain.operator import config
from ckptdrain.operator.admission import holder_mirror
from ckptdrain.operator.admission import process as admission_process
from ckptdrain.operator.admission import rules as admission
from ckptdrain.operator.admission.holder_mirror import HolderMirror
from ckptdrain.operator.admission.policy_mirror import PolicyMirror
from ckptdrain.operator.apiserver import reads as apiserver_reads

CFG = config.OperatorConfig(allowed_root="/mnt/ckptdrain")


def writer(name: str, rank: int | str, policy: str = "llama", namespace: str = "ml",
           phase: str = "Running", deleting: bool = False, version: str = "1"
           ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "resourceVersion": version,
                            "labels": {"ckptdrain.io/writer": str(rank), "app": "a"},
                            "annotations": {"ckptdrain.io/policy": policy,
                                            "ckptdrain.io/progress": "x" * 1000}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    return {"metadata": meta, "spec": {"containers": []}, "status": {"phase": phase}}


def test_nothing_is_offered_until_listed_or_after_a_lost_watch() -> None:
    mirror = HolderMirror()
    assert mirror.holders_of("ml", "llama") is None
    mirror.replace([writer("w-0", 0)], "5")
    holders = mirror.holders_of("ml", "llama")
    assert holders is not None and holders(0) == ["w-0"] and holders(1) == []
    assert mirror.version == "5"
    mirror.lost()
    assert mirror.holders_of("ml", "llama") is None
    # A lookup begun before the loss names a holder, so that a fresh read decides.
    assert holders(1) != []


def test_events_file_and_unfile_pods_by_namespace_policy_and_rank() -> None:
    mirror = HolderMirror()
    mirror.replace([], "1")
    mirror.apply("ADDED", writer("w-0", 0, version="2"))
    mirror.apply("ADDED", writer("x-0", 0, policy="other"))
    mirror.apply("ADDED", writer("w-0", 0, namespace="ml-b"))
    look = mirror.holders_of("ml", "llama")
    assert look is not None and look(0) == ["w-0"]
    mirror.apply("MODIFIED", writer("w-0", 1))  # relabelled: moves
    assert look(0) == [] and look(1) == ["w-0"]
    mirror.apply("MODIFIED", writer("w-0", 1, phase="Succeeded"))
    assert look(1) == []  # not live: not a holder
    mirror.apply("MODIFIED", writer("w-1", 1, deleting=True))
    assert look(1) == []
    mirror.apply("ADDED", writer("w-2", 1))
    mirror.apply("DELETED", writer("w-2", 1, version="9"))
    assert look(1) == [] and mirror.version == "9"
    mirror.apply("ADDED", writer("w-3", "not-a-rank"))
    mirror.apply("BOOKMARK", {"metadata": {"resourceVersion": "10"}})
    assert mirror.version == "10"
    other = mirror.holders_of("ml-b", "llama")
    assert other is not None and other(0) == ["w-0"]


def test_the_first_list_keeps_only_what_it_needs() -> None:
    slim = holder_mirror._slim(writer("w-0", 3))
    assert slim["metadata"]["annotations"] == {"ckptdrain.io/policy": "llama"}
    assert slim["metadata"]["labels"] == {"ckptdrain.io/writer": "3"}
    assert "spec" not in slim and holder_mirror._filed(slim)[1:] == (("ml", "llama", 3), True)


def _policy() -> dict[str, Any]:
    return {"metadata": {"name": "llama", "namespace": "ml", "resourceVersion": "1"},
            "spec": {"selector": {"matchLabels": {"app": "a"}}, "model": {"parameters": "7B"},
                     "interval": "10m", "writers": 2,
                     "localTier": {"path": "/mnt/ckptdrain/n"},
                     "storage": {"uri": "s3://bucket/p"}}}


def _review(index: int) -> dict[str, Any]:
    pod = {"metadata": {"generateName": "w-", "namespace": "ml",
                        "labels": {"app": "a", "ckptdrain.io/inject": "true"},
                        "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                             "name": "train", "controller": True,
                                             "uid": "j-1"}]},
           "spec": {"containers": [{"name": "trainer", "image": "t"}]}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": "CREATE", "namespace": "ml",
                        "object": pod}}


@dataclass
class Reads:
    """Every read of a rank's holders from the apiserver (rank, from the
    watch cache), and the holders a read finds per rank."""

    done: list[tuple[int, bool]] = field(default_factory=list)
    there: dict[int, list[str]] = field(default_factory=dict)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Reads:
    state = Reads()

    def live_writers(namespace: str, name: str, rank: int, cached: bool = False) -> list[str]:
        state.done.append((rank, cached))
        return list(state.there.get(rank, []))
    monkeypatch.setattr(apiserver_reads, "live_writers", live_writers)
    monkeypatch.setattr(apiserver_reads, "read_object", lambda *ref: {"spec": {"completions": 2}})
    monkeypatch.setattr(apiserver_reads, "list_policies", lambda namespace: [])
    return state


def _reviewer(*writers: dict[str, Any], listed: bool = True
              ) -> tuple[admission_process.Reviewer, HolderMirror]:
    """A Reviewer whose view of the policies has `_policy()` and whose view of
    the writer pods has `writers` (never listed: `listed` False)."""
    policies = PolicyMirror()
    policies.replace([_policy()], "1")
    view = HolderMirror()
    if listed:
        view.replace(list(writers), "1")
    return admission_process.Reviewer(CFG, policies, None, view), view


def _answer(reviewer: admission_process.Reviewer, index: int) -> dict[str, Any]:
    return asyncio.run(reviewer(_review(index), admission.MUTATE_ID))["response"]


def test_admission_reads_nothing_when_the_view_names_no_holder(
        reads: Reads) -> None:
    reviewer, _ = _reviewer(writer("w-a", 0))
    answer = _answer(reviewer, 1)
    assert answer["allowed"] is True and reads.done == []
    ops = json.loads(base64.b64decode(answer["patch"]))
    assert {"op": "add", "path": "/metadata/labels/ckptdrain.io~1writer", "value": "1"} in ops


def test_a_holder_in_the_view_is_confirmed_by_a_fresh_read_before_a_refusal(
        reads: Reads) -> None:
    reviewer, _ = _reviewer(writer("w-a", 0))
    # The holder left a moment ago: the fresh read finds none, the pod is admitted.
    assert _answer(reviewer, 0)["allowed"] is True and reads.done == [(0, False)]
    reads.there[0] = ["w-a"]
    answer = _answer(reviewer, 0)
    assert answer["allowed"] is False and answer["status"]["code"] == 409
    assert "w-a" in answer["status"]["message"] and reads.done[-1] == (0, False)


def test_without_a_current_view_the_apiserver_is_asked_as_before(
        reads: Reads) -> None:
    reviewer, _ = _reviewer(listed=False)
    assert _answer(reviewer, 1)["allowed"] is True
    assert reads.done == [(1, True)]  # the watch cache, as without a view


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_view_that_heard_nothing_for_a_while_is_not_offered() -> None:
    """A half-open watch must not answer "no holder" for minutes."""
    clock = Clock()
    mirror = HolderMirror(clock=clock)
    mirror.replace([writer("w-0", 0)], "1")
    assert mirror.holders_of("ml", "llama") is not None
    clock.now += holder_mirror.FRESH_S
    assert mirror.holders_of("ml", "llama") is None
    mirror.apply("BOOKMARK", {"metadata": {"resourceVersion": "2"}})  # heard again
    assert mirror.holders_of("ml", "llama") is not None


def test_a_namespaced_view_knows_nothing_of_other_namespaces() -> None:
    mirror = HolderMirror("ml")
    mirror.replace([], "1")
    assert mirror.holders_of("ml", "llama") is not None
    assert mirror.holders_of("other", "llama") is None
    assert mirror.holders_of("", "llama") is None


def test_a_rank_admitted_here_counts_as_held_until_its_pod_is_seen() -> None:
    clock = Clock()
    mirror = HolderMirror(clock=clock)
    mirror.replace([], "1")
    mirror.claimed("ml", "llama", 1)
    look = mirror.holders_of("ml", "llama")
    assert look is not None and look(1) != [] and look(0) == []
    mirror.apply("ADDED", writer("w-1", 1))  # its event: the view knows it by name
    assert look(1) == ["w-1"]
    mirror.claimed("ml", "llama", 0)
    clock.now += holder_mirror.CLAIM_S - 1
    mirror.heard()
    assert look(0) != []
    clock.now += 2  # never created (a later webhook refused it): forgotten
    mirror.heard()
    assert look(0) == []


def test_the_reviewer_claims_the_rank_it_admitted(reads: Reads) -> None:
    reviewer, writers = _reviewer()
    assert _answer(reviewer, 1)["allowed"] is True and reads.done == []
    look = writers.holders_of("ml", "llama")
    assert look is not None and look(1) != [] and look(0) == []
    # A second pod for rank 1 a moment later: the fresh read decides.
    reads.there[1] = ["w-1"]
    answer = _answer(reviewer, 1)
    assert answer["allowed"] is False and reads.done == [(1, False)]


def test_the_watch_thread_pages_the_list_watches_from_its_version_and_relists_on_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lists: list[list[tuple[str, str]]] = []
    watches: list[str] = []
    pages = [
        {"items": [writer("w-0", 0)], "metadata": {"continue": "t1", "resourceVersion": "5"}},
        {"items": [writer("w-1", 1)], "metadata": {"resourceVersion": "7"}},
    ]

    def get_json(path: str, query: list[tuple[str, str]], timeout: float) -> dict[str, Any]:
        lists.append(query)
        return pages[(len(lists) - 1) % 2]

    class Stream:
        def __init__(self, lines: list[bytes]) -> None:
            self.lines = lines
            self.closed = self.released = False

        def stream(self, amt: int) -> Any:
            return iter(self.lines)

        def close(self) -> None:
            self.closed = True

        def release_conn(self) -> None:
            self.released = True

    streams = [Stream([json.dumps({"type": "DELETED", "object": writer("w-0", 0, version="8")})
                       .encode() + b"\n",
                       json.dumps({"type": "ERROR", "object": {"code": 410}}).encode()])]
    first = streams[0]
    done = threading.Event()

    def stream(path: str, query: list[tuple[str, str]], timeout: Any) -> Stream:
        watches.append(dict(query)["resourceVersion"])
        if streams:
            return streams.pop()
        done.set()
        raise apiserver_reads.ApiError(500, "stop here")
    monkeypatch.setattr(apiserver_reads, "get_json", get_json)
    monkeypatch.setattr(apiserver_reads, "stream", stream)
    monkeypatch.setattr(holder_mirror, "RETRY_S", (0.01,))
    mirror = HolderMirror()
    stopping = threading.Event()
    holder_mirror.start(mirror, "", logging.getLogger("test"), stopping)
    assert done.wait(10)
    stopping.set()
    # Two pages, the continue token on the second; the watch from the last page's version.
    assert ("continue", "t1") in lists[1] and ("limit", "500") in lists[0]
    assert watches[0] == "7"
    # The ERROR ended the watch: listed again before the next watch.
    assert len(lists) >= 4 and watches[1] == "7"
    assert first.closed and not first.released  # ended mid-stream: not reused


def pinned_writer(name: str, rank: int, image: str, **kw: Any) -> dict[str, Any]:
    pod = writer(name, rank, **kw)
    pod["metadata"]["annotations"].update({"ckptdrain.io/agent-image": image,
                                           "ckptdrain.io/injected": "true"})
    pod["metadata"]["labels"]["ckptdrain.io/inject"] = "true"
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}]
    return pod


def test_the_view_counts_each_generations_agent_images_as_events_come() -> None:
    mirror = HolderMirror()
    gen = "Job/u-1"
    assert mirror.running("ml", "llama", gen, "x") is None  # not listed: the apiserver decides
    mirror.replace([pinned_writer("w-0", 0, "ckptdrain:1"),
                    pinned_writer("w-1", 1, "ckptdrain:1", deleting=True),
                    pinned_writer("w-2", 2, "ckptdrain:1", phase="Failed")], "1")
    # Only the live one counts.
    assert mirror.running("ml", "llama", gen, "new") == {"ckptdrain:1": 1}
    # The pod asking is not its own sibling (a name reused before the old
    # pod's deletion was seen).
    assert mirror.running("ml", "llama", gen, "w-0") == {}
    mirror.apply("MODIFIED", pinned_writer("w-0", 0, "ckptdrain:1", deleting=True))
    assert mirror.running("ml", "llama", gen, "new") == {}
    mirror.apply("ADDED", pinned_writer("w-3", 3, "ckptdrain:2"))
    mirror.apply("ADDED", pinned_writer("w-4", 4, "ckptdrain:2"))
    mirror.apply("MODIFIED", pinned_writer("w-4", 4, "ckptdrain:2"))  # counted once
    mirror.apply("DELETED", pinned_writer("w-0", 0, "ckptdrain:1"))
    assert mirror.running("ml", "llama", gen, "new") == {"ckptdrain:2": 2}
    mirror.apply("MODIFIED", pinned_writer("w-4", 4, "ckptdrain:1"))  # edited: moves
    assert mirror.running("ml", "llama", gen, "new") == {"ckptdrain:2": 1, "ckptdrain:1": 1}
    assert mirror.running("ml", "other", gen, "new") == {}
    assert mirror.running("ml", "llama", "Job/another", "new") == {}
    slim = holder_mirror._slim(pinned_writer("w-9", 9, "ckptdrain:1"))
    assert slim["metadata"]["ownerReferences"] == [
        {"kind": "Job", "uid": "u-1", "controller": True}]
    assert "ckptdrain.io/progress" not in slim["metadata"]["annotations"]
    mirror.replace([], "9")
    assert mirror.running("ml", "llama", gen, "new") == {}
    mirror.lost()
    assert mirror.running("ml", "llama", gen, "new") is None
