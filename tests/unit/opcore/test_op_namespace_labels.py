"""The labels of a policy's namespace as the operator reads them
(apiserver/namespace_labels.py): a reading is reused for MAX_AGE_S, read
again after; when a read fails the last reading stands, and with none the
failure names the namespace."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ckptdrain.errors import InvalidInput
from ckptdrain.operator.apiserver import namespace_labels, reads


@pytest.fixture
def apiserver(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """What the apiserver answers: the labels, or an error to raise; and the
    paths asked."""
    state: dict[str, Any] = {"labels": {"tenant": "a"}, "error": None, "asked": []}

    def get_json(path: str, query: list[tuple[str, str]], timeout: float) -> dict[str, Any]:
        state["asked"].append(path)
        if state["error"] is not None:
            raise state["error"]
        return {"metadata": {"name": path.rsplit("/", 1)[1], "labels": dict(state["labels"])}}

    clock = {"now": 1000.0}
    monkeypatch.setattr(reads, "get_json", get_json)
    monkeypatch.setattr(namespace_labels.time, "monotonic", lambda: clock["now"])
    state["clock"] = clock
    namespace_labels.forget()
    yield state
    namespace_labels.forget()


def test_a_recent_reading_is_reused_then_read_again(apiserver: dict[str, Any]) -> None:
    assert namespace_labels.recent("ml-a") == {"tenant": "a"}
    apiserver["labels"] = {"tenant": "b"}
    assert namespace_labels.recent("ml-a") == {"tenant": "a"}
    assert apiserver["asked"] == ["/api/v1/namespaces/ml-a"]
    apiserver["clock"]["now"] += namespace_labels.MAX_AGE_S
    assert namespace_labels.recent("ml-a") == {"tenant": "b"}


def test_fresh_always_reads_and_updates_what_recent_hands_out(
        apiserver: dict[str, Any]) -> None:
    namespace_labels.recent("ml-a")
    apiserver["labels"] = {}
    assert namespace_labels.fresh("ml-a") == {}
    assert namespace_labels.recent("ml-a") == {}


def test_a_failed_read_keeps_the_last_reading_and_without_one_names_the_namespace(
        apiserver: dict[str, Any]) -> None:
    namespace_labels.recent("ml-a")
    apiserver["clock"]["now"] += namespace_labels.MAX_AGE_S
    apiserver["error"] = reads.ApiError(503, "Service Unavailable")
    assert namespace_labels.recent("ml-a") == {"tenant": "a"}
    with pytest.raises(InvalidInput) as caught:
        namespace_labels.recent("ml-b")
    assert caught.value.field == "metadata.namespace" and "ml-b" in str(caught.value)
    with pytest.raises(reads.ApiError):
        namespace_labels.fresh("ml-a")
