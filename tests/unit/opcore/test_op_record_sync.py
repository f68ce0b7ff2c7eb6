"""operator/records/sync.py, the reading side: a pod's progress annotation
(untrusted: the pod's to write), which steps a pod event moved, and the
claims of one step across the writers' pods."""

from __future__ import annotations

import itertools
import json
import logging
from datetime import UTC, datetime

import pytest

from ckptdrain.contract import progress
from ckptdrain.contract import record as fmt
from ckptdrain.contract.progress import Claim
from ckptdrain.operator.records import aggregate as records
from ckptdrain.operator.records import sync as record_sync
from ckptdrain.operator.records.sync import WriterProgress

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
_uids = itertools.count()


def uid() -> str:
    """A pod uid no other test used (record_sync remembers pods by uid)."""
    return f"uid-{next(_uids)}"


def claim(state: str, size: int = 10, at: str | None = "2026-01-02T03:04:05Z") -> Claim:
    return Claim(state=state, bytes=size, tiers=() if state == "Capturing" else ("local",),
                 at=at)


def doc(writer: int, steps: dict[int, Claim], writers: int = 8) -> str:
    return progress.encode(writer, writers, steps)


# -- progress_of --------------------------------------------------------------


def test_a_pods_progress_is_read_with_its_node() -> None:
    found = record_sync.progress_of("w-3", "node-a", doc(3, {7: claim("Local")}), uid(), "3")
    assert found == WriterProgress(pod="w-3", node="node-a", writer=3,
                                   steps={7: claim("Local")}, writers=8)
    assert record_sync.progress_of("w-3", "", doc(3, {}), uid()).node is None  # not scheduled


@pytest.mark.parametrize("text", [None, ""])
def test_no_annotation_is_no_progress(text: str | None) -> None:
    assert record_sync.progress_of("w-0", "n", text, uid(), "0") is None


@pytest.mark.parametrize("text", [
    "not json", "[]", '{"writer": 0}', '{"writer": "0", "steps": {}}',
    json.dumps({"writer": 0, "steps": {"7": {"state": "Expired"}}}),
    json.dumps({"writer": 0, "steps": {"7": {"state": "Global", "bytes": -5}}}),
    "x" * (progress.MAX_DOCUMENT + 1)])
def test_a_malformed_annotation_counts_as_none(text: str) -> None:
    assert record_sync.progress_of("w-0", "n", text, uid(), "0") is None


def test_a_pod_cannot_speak_for_another_rank() -> None:
    text = doc(1, {7: claim("Global")})
    assert record_sync.progress_of("w-0", "n", text, uid(), "0") is None
    assert record_sync.progress_of("w-0", "n", text, uid(), "01") is None
    assert record_sync.progress_of("w-1", "n", text, uid(), "1") is not None
    # A pod without the label (not ranked yet): its document is all there is.
    assert record_sync.progress_of("w-0", "n", text, uid(), None) is not None


def test_a_refused_annotation_is_logged_once_per_value(caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    pod = uid()
    with caplog.at_level(logging.WARNING, logger=record_sync.log.name):
        for _ in range(3):
            record_sync.progress_of("w-0", "n", "not json", pod, "0")
        record_sync.progress_of("w-0", "n", doc(1, {}), pod, "0")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "w-0" in warnings[0].getMessage() and "writer" in warnings[1].getMessage()


# -- changed_steps ------------------------------------------------------------


def test_only_steps_whose_claims_moved_are_folded() -> None:
    pod = uid()
    first = {5: claim("Global"), 6: claim("Local"), 7: claim("Capturing", 0)}
    assert record_sync.changed_steps(pod, doc(0, first), False) == [5, 6, 7]
    # The same progress again (the pod changed elsewhere: its goodput, a label).
    assert record_sync.changed_steps(pod, doc(0, first), False) == []
    moved = {**first, 6: claim("Draining"), 8: claim("Capturing", 0)}
    assert record_sync.changed_steps(pod, doc(0, moved), False) == [6, 8]
    # A step that falls out of the document changes nothing: the record keeps it.
    dropped = {s: c for s, c in moved.items() if s != 5}
    assert record_sync.changed_steps(pod, doc(0, dropped), False) == []


def test_pods_are_told_apart() -> None:
    a, b = uid(), uid()
    text = doc(0, {5: claim("Local")})
    assert record_sync.changed_steps(a, text, False) == [5]
    assert record_sync.changed_steps(b, text, False) == [5]


def test_a_deleted_pod_changes_nothing() -> None:
    pod = uid()
    assert record_sync.changed_steps(pod, doc(0, {5: claim("Local")}), False) == [5]
    assert record_sync.changed_steps(pod, doc(0, {5: claim("Global"), 6: claim("Local")}),
                                     True) == []
    assert record_sync.changed_steps(uid(), doc(0, {5: claim("Local")}), True) == []


@pytest.mark.parametrize("bad", [None, "", "not json", '{"writer": 0, "writers": 1, "steps": 3}'])
def test_a_pod_without_readable_progress_changes_nothing(bad: str | None) -> None:
    pod = uid()
    assert record_sync.changed_steps(pod, bad, False) == []
    good = doc(0, {5: claim("Local")})
    assert record_sync.changed_steps(pod, good, False) == [5]
    assert record_sync.changed_steps(pod, bad, False) == []


# -- claims_for ---------------------------------------------------------------


def writer(pod: str, rank: int, steps: dict[int, Claim]) -> WriterProgress:
    return WriterProgress(pod=pod, node=None, writer=rank, steps=steps)


def test_claims_for_a_step_come_from_every_pod_that_has_one() -> None:
    pods = [writer("w-0", 0, {5: claim("Global"), 6: claim("Local")}),
            writer("w-1", 1, {5: claim("Local")}),
            writer("w-2", 2, {6: claim("Local")})]
    assert record_sync.claims_for(pods, 5) == {0: claim("Global"), 1: claim("Local")}
    assert record_sync.claims_for(pods, 6) == {0: claim("Local"), 2: claim("Local")}
    assert record_sync.claims_for(pods, 4) == {}
    assert record_sync.claims_for([], 5) == {}


@pytest.mark.parametrize("order", [0, 1])
def test_the_newest_claim_of_a_rank_wins(order: int) -> None:
    # The finished pod of rank 0 and its replacement both name step 5.
    old = writer("w-0-old", 0, {5: claim("Failed", at="2026-01-02T03:00:00Z")})
    new = writer("w-0-new", 0, {5: claim("Global", at="2026-01-02T03:10:00Z")})
    pods = [old, new] if order == 0 else [new, old]
    assert record_sync.claims_for(pods, 5) == {0: new.steps[5]}
    undated = writer("w-0-x", 0, {5: claim("Local", at=None)})
    assert record_sync.claims_for([new, undated], 5) == {0: new.steps[5]}
    assert record_sync.claims_for([undated, new], 5) == {0: new.steps[5]}


def test_from_the_pods_annotations_to_the_record() -> None:
    # What the agents write, as the handlers read it and fold it.
    pods = [("w-0", "0", doc(0, {5: claim("Global", 100)})),
            ("w-1", "1", doc(1, {5: claim("Global", 50), 4: claim("Local")})),
            ("w-9", "2", doc(9, {5: claim("Failed")}))]  # speaks for another rank: ignored
    found = [record_sync.progress_of(name, "n", text, uid(), rank)
             for name, rank, text in pods]
    claims = record_sync.claims_for([f for f in found if f is not None], 5)
    change = records.fold(fmt.build_record("ns", "pol", 5, 2), claims, NOW)
    assert change["state"] == "Global" and change["sizeBytes"] == 150
    assert change["ranks"]["Global"] == "0-1" and change["ranks"]["Failed"] is None


def test_the_newer_pod_of_a_rank_speaks_for_it_whatever_its_claims_say() -> None:
    old = WriterProgress(pod="w-0", node="a", writer=0, writers=2, created="2026-01-01T00:00:00Z",
                         steps={7: claim("Global", at="9999-01-01T00:00:00Z")})
    new = WriterProgress(pod="w-0b", node="b", writer=0, writers=2,
                         created="2026-01-02T00:00:00Z", steps={7: claim("Capturing")})
    assert record_sync.claims_for([old, new], 7)[0].state == "Capturing"
    assert record_sync.claims_for([new, old], 7)[0].state == "Capturing"


def test_only_pods_told_the_records_writer_count_count() -> None:
    four = [WriterProgress(pod=f"w-{r}", node="a", writer=r, writers=4,
                           steps={7: claim("Global")}) for r in range(2)]
    eight = [WriterProgress(pod=f"v-{r}", node="a", writer=r, writers=8,
                            steps={7: claim("Global")}) for r in range(2, 5)]
    assert sorted(record_sync.claims_for(four + eight, 7, 8)) == [2, 3, 4]
    assert sorted(record_sync.claims_for(four + eight, 7, 4)) == [0, 1]
    # A new record waits for what most pods were told (ties: the larger).
    assert record_sync.writers_for(four + eight, 7) == 8
    assert record_sync.writers_for(four + eight[:2], 7) == 8
    assert record_sync.writers_for(four, 8) is None


def test_a_deleted_pods_last_word_is_kept_until_folded_then_forgotten() -> None:
    key = ("ns", "departing")
    gone = record_sync.progress_of("w-1", "n", doc(1, {7: claim("Global")}, writers=2),
                                   uid(), "1")
    assert record_sync.depart(key, "uid-gone", gone, now=100.0) == [7]
    live = [WriterProgress(pod="w-0", node="n", writer=0, writers=2, steps={7: claim("Local")})]
    writers = record_sync.with_departed(key, live, now=200.0)
    assert sorted(record_sync.claims_for(writers, 7, 2)) == [0, 1]
    later = 100.0 + record_sync.DEPARTED_KEEP_S + 1
    assert record_sync.with_departed(key, live, now=later) == live
    assert record_sync.depart(key, "uid-none", None, now=100.0) == []


# -- completions: what a policy's history reads at a move ---------------------------


def _complete(policy: str, step: int, when: datetime) -> dict[str, object]:
    r = fmt.build_record("ml", policy, step, 1)
    r["status"] = records.fold(r, {0: claim("Global")}, when)
    return r


def test_a_move_reads_the_records_as_the_apiserver_has_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The index has not seen the fold that completed step 3000 a moment ago.
    indexed = [_complete("llama", 4200, NOW)]
    listed = [*indexed, _complete("llama", 3000, NOW), _complete("other", 9, NOW)]
    asked: list[tuple[str, str, str]] = []

    def list_own(plural: str, namespace: str, selector: str) -> list[dict[str, object]]:
        asked.append((plural, namespace, selector))
        return listed
    monkeypatch.setattr(record_sync.kube, "list_own", list_own)
    log = logging.getLogger("t")
    assert sorted(record_sync.completions(("ml", "llama"), indexed, log)) == [
        (3000, "2026-01-02T03:04:05Z"), (4200, "2026-01-02T03:04:05Z")]
    assert asked == [("checkpoints", "ml", "ckptdrain.io/policy=llama")]

    def unanswered(*_: object) -> list[dict[str, object]]:
        raise record_sync.kube.ApiException(status=503)
    monkeypatch.setattr(record_sync.kube, "list_own", unanswered)
    assert record_sync.completions(("ml", "llama"), indexed, log) == [
        (4200, "2026-01-02T03:04:05Z")]
