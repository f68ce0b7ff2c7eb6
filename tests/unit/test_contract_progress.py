"""contract/progress.py: a writer's progress on its own pod, the document the
agent writes and the operator reads back as untrusted input.

(tests/unit/test_progress.py is the trainer's progress file, progress.py.)"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from ckptdrain.contract import progress
from ckptdrain.contract.progress import MAX_DOCUMENT, MAX_MESSAGE, MAX_STEPS, Claim
from ckptdrain.contract.record import REQUEST_FIELDS
from ckptdrain.errors import InvalidInput

NOW = datetime(2026, 11, 26, 18, 0, 0, tzinfo=UTC)
FIELD = f"metadata.annotations[{progress.ANNOTATION_PROGRESS}]"


def full_claim(state: str = "Global") -> Claim:
    return progress.claim_of(state, 1 << 20, ["local", "global", "local"], NOW,
                             message="drain: 3 parts retried", peer_holder=4,
                             peer_node="n-b", requests={"put": 12, "bytesUp": 1 << 20})


def test_a_document_reads_back_as_written() -> None:
    steps = {120: full_claim(), 119: progress.claim_of("Capturing", 0, [], NOW),
             118: progress.claim_of("Failed", 7, ["local"], NOW, message="denied")}
    text = progress.encode(3, 8, steps)
    back = progress.parse(text)
    assert back.writer == 3 and dict(back.steps) == steps
    claim = back.steps[120]
    assert claim.tiers == ("global", "local")  # sorted, once each
    assert (claim.peer_holder, claim.peer_node, claim.at) == (4, "n-b", "2026-11-26T18:00:00Z")
    assert claim.requests == {"put": 12, "bytesUp": 1 << 20}
    assert back.steps[119].message is None and back.steps[119].peer_holder is None
    assert json.loads(text)["writer"] == 3  # what a person reading the pod sees


def test_the_agent_shortens_a_long_message_and_drops_empty_fields() -> None:
    claim = progress.claim_of("Failed", 0, ["local"], NOW, message="x" * 1000, peer_node="")
    assert claim.message == "x" * MAX_MESSAGE and claim.peer_node is None
    assert progress.claim_of("Local", 0, [], NOW, message="").message is None
    assert progress.parse(progress.encode(0, 1, {1: claim})).steps[1] == claim


def test_the_largest_document_an_agent_writes_is_still_accepted() -> None:
    # Every field at its longest, a message that JSON escapes (6 characters
    # per character), a node name at its longest: the operator must not
    # refuse what the agent itself wrote.
    steps = {s: progress.claim_of("Failed", 10**14, ["global", "local", "peer"], NOW,
                                  message="é" * MAX_MESSAGE, peer_holder=10**6 - 1,
                                  peer_node="n" * 253,
                                  requests={k: 10**12 for k in REQUEST_FIELDS})
             for s in range(10**14, 10**14 + MAX_STEPS)}
    text = progress.encode(10**6 - 1, 10**6, steps)
    assert len(text) <= MAX_DOCUMENT
    assert dict(progress.parse(text).steps) == steps


def test_with_claim_keeps_the_newest_steps() -> None:
    steps: dict[int, Claim] = {}
    for step in range(1, 20):
        steps = progress.with_claim(steps, step, full_claim("Local"))
    assert sorted(steps) == list(range(20 - MAX_STEPS, 20))
    newer = progress.with_claim(steps, 19, full_claim("Global"))
    assert newer[19].state == "Global" and steps[19].state == "Local"  # a copy
    assert len(newer) == MAX_STEPS
    # A step older than every kept one does not push a newer one out.
    assert progress.with_claim(steps, 3, full_claim()) == steps
    assert sorted(progress.with_claim({}, 5, full_claim(), keep=1)) == [5]


def _doc(**entry: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"state": "Local", "bytes": 10, "tiers": ["local"],
                            "at": "2026-01-01T00:00:00Z"}
    base.update(entry)
    return {"writer": 3, "writers": 8, "steps": {"5": base}}


def _refused(text: str) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        progress.parse(text)
    return caught.value


def test_a_valid_entry_is_accepted() -> None:
    # The baseline every case below breaks one field of.
    assert progress.parse(json.dumps(_doc())).steps[5].state == "Local"


@pytest.mark.parametrize(("key", "value"), [
    ("state", "Done"), ("state", "Expired"), ("state", None), ("state", 1),
    ("bytes", -1), ("bytes", "10"), ("bytes", True), ("bytes", 1.5), ("bytes", None),
    ("tiers", ["tape"]), ("tiers", "local"), ("tiers", None), ("tiers", [["local"]]),
    ("at", "yesterday"), ("at", "2026-01-01 00:00:00"), ("at", 1767225600),
    ("message", "x" * (MAX_MESSAGE + 1)), ("message", 5), ("message", ["x"]),
    ("peerHolder", -1), ("peerHolder", "0"), ("peerHolder", 1.0), ("peerHolder", False),
    ("peerNode", "n" * 254), ("peerNode", 3),
    ("requests", {"posts": 1}), ("requests", {"put": -1}), ("requests", {"put": "1"}),
    ("requests", {"put": 1.5}), ("requests", [["put", 1]]),
])
def test_every_invalid_field_is_refused_by_name(key: str, value: Any) -> None:
    err = _refused(json.dumps(_doc(**{key: value})))
    assert err.field == f"{FIELD}.steps.5.{key}"


def test_a_missing_state_is_refused() -> None:
    doc = _doc()
    del doc["steps"]["5"]["state"]
    assert _refused(json.dumps(doc)).field == f"{FIELD}.steps.5.state"


def test_limits_are_inclusive() -> None:
    assert progress.parse(json.dumps(_doc(message="x" * MAX_MESSAGE))).steps[5].message
    assert progress.parse(json.dumps(_doc(peerNode="n" * 253))).steps[5].peer_node
    many = {"writer": 0, "writers": 1,
            "steps": {str(s): {"state": "Local"} for s in range(MAX_STEPS)}}
    assert len(progress.parse(json.dumps(many)).steps) == MAX_STEPS
    text = json.dumps(_doc())
    assert progress.parse(text + " " * (MAX_DOCUMENT - len(text)))


@pytest.mark.parametrize("key", ["x5", "-5", "5.0", " 5", "", "١٢", str(10**15 + 1)])
def test_a_step_that_is_not_a_step_number_is_refused(key: str) -> None:
    doc = {"writer": 3, "writers": 8, "steps": {key: {"state": "Local"}}}
    err = _refused(json.dumps(doc))
    assert err.field == f"{FIELD}.steps.{key[:20]}"


def test_a_step_entry_that_is_not_an_object_is_refused() -> None:
    err = _refused(json.dumps({"writer": 3, "writers": 8, "steps": {"5": "Local"}}))
    assert err.field == f"{FIELD}.steps.5"


@pytest.mark.parametrize("writer", [None, -1, "3", True, 2.0, 8])
def test_a_writer_that_is_not_a_rank_is_refused(writer: Any) -> None:
    doc: dict[str, Any] = {"writers": 8, "steps": {}}
    if writer is not None:
        doc["writer"] = writer
    assert _refused(json.dumps(doc)).field == f"{FIELD}.writer"


@pytest.mark.parametrize("writers", [None, 0, -1, "8", True, 10**6 + 1])
def test_a_writer_count_that_is_not_one_is_refused(writers: Any) -> None:
    doc: dict[str, Any] = {"writer": 0, "steps": {}}
    if writers is not None:
        doc["writers"] = writers
    assert _refused(json.dumps(doc)).field == f"{FIELD}.writers"


def test_counts_beyond_what_a_record_can_sum_are_refused() -> None:
    assert _refused(json.dumps(_doc(bytes=progress.MAX_COUNT + 1))).field.endswith(".bytes")
    assert _refused(json.dumps(_doc(requests={"put": 10**4000}))).field.endswith(".requests")
    huge_step = {"writer": 0, "writers": 1, "steps": {"9" * 5000: {"state": "Local"}}}
    assert _refused(json.dumps(huge_step)).field.endswith(".steps." + "9" * 20)


@pytest.mark.parametrize("steps", [None, [], "5", {str(s): {"state": "Local"}
                                                   for s in range(MAX_STEPS + 1)}])
def test_steps_must_be_an_object_of_few_steps(steps: Any) -> None:
    doc: dict[str, Any] = {"writer": 3, "writers": 8}
    if steps is not None:
        doc["steps"] = steps
    assert _refused(json.dumps(doc)).field == f"{FIELD}.steps"


@pytest.mark.parametrize("text", ["[]", '"steps"', "3", "null", "{", "", "{'writer': 3}"])
def test_anything_but_a_json_object_is_refused_whole(text: str) -> None:
    assert _refused(text).field == FIELD


def test_an_oversize_document_is_refused_whole_before_it_is_read() -> None:
    text = json.dumps(_doc())
    err = _refused(text + " " * (MAX_DOCUMENT - len(text) + 1))
    assert err.field == FIELD
    assert _refused("x" * 10 * MAX_DOCUMENT).field == FIELD


def test_deeply_nested_json_is_refused_like_any_other_bad_input() -> None:
    # Within MAX_DOCUMENT but nested a few thousand levels deep, json.loads
    # raises RecursionError: it must not escape parse (and fail the
    # operator's pod event handler) for one pod's annotation.
    nested = "[" * 5000 + "]" * 5000
    assert len(nested) <= MAX_DOCUMENT
    assert _refused(nested).field == FIELD


def test_the_field_name_given_is_the_one_named() -> None:
    with pytest.raises(InvalidInput) as caught:
        progress.parse(json.dumps(_doc(bytes=-1)), "pods/w-0.progress")
    assert caught.value.field == "pods/w-0.progress.steps.5.bytes"


def test_expired_is_the_operators_word_never_a_writers() -> None:
    with pytest.raises(InvalidInput) as caught:
        progress.claim_of("Expired", 0, [], NOW)
    assert caught.value.field.endswith(".state")
    assert "Expired" not in caught.value.expected
    for state in ("Capturing", "Local", "Draining", "Retrying", "Global", "Failed"):
        assert progress.parse(json.dumps(_doc(state=state))).steps[5].state == state


def test_the_agent_side_checks_what_it_writes_too() -> None:
    with pytest.raises(InvalidInput) as caught:
        progress.claim_of("Global", 1, ["local"], NOW, requests={"posts": 1})
    assert caught.value.field.endswith(".requests")
    with pytest.raises(InvalidInput):
        progress.claim_of("Global", -1, ["local"], NOW)
    with pytest.raises(InvalidInput):
        progress.claim_of("Global", 1, ["tape"], NOW)
