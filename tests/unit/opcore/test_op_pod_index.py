"""Which pods the operator counts as drainers (its pod index)."""

from __future__ import annotations

from typing import Any

from ckptdrain.operator import handlers

ANN = {"ckptdrain.io/policy": "llama", "ckptdrain.io/injected": "true"}


def _entry(meta: dict[str, Any], phase: str) -> dict[Any, Any]:
    fn = getattr(handlers.pod_index, "__wrapped__", handlers.pod_index)
    return fn(namespace="ml", name="w-0", meta={"annotations": ANN, **meta},
              status={"phase": phase})


def test_a_finished_pod_leaves_the_index_with_an_empty_entry_not_none() -> None:
    # Kopf keeps the previous entry when an indexer returns None.
    assert _entry({}, "Succeeded") == {}
    assert _entry({}, "Failed") == {}


def test_a_pod_in_its_grace_period_still_drains() -> None:
    # It is flushing its emergency checkpoint and needs its share.
    leaving = _entry({"deletionTimestamp": "2026-01-01T00:00:00Z"}, "Running")
    assert list(leaving) == [("ml", "llama")]
    assert list(_entry({}, "Running")) == [("ml", "llama")]


def test_only_pods_injected_with_a_scale_reading_agent_follow_the_scale() -> None:
    older = _entry({}, "Running")[("ml", "llama")]
    newer = _entry({"annotations": {**ANN, "ckptdrain.io/share-scale": "true"}},
                   "Running")[("ml", "llama")]
    assert not older.follows_scale and newer.follows_scale
