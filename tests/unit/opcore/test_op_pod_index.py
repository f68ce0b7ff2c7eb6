"""Which pods the operator counts as drainers (its pod index)."""

from __future__ import annotations

from typing import Any

from ckptdrain.operator import handlers

ANN = {"ckptdrain.io/policy": "llama", "ckptdrain.io/injected": "true"}


def _entry(meta: dict[str, Any], phase: str, spec: dict[str, Any] | None = None
           ) -> dict[Any, Any]:
    fn = getattr(handlers.pod_index, "__wrapped__", handlers.pod_index)
    return fn(namespace="ml", name="w-0", meta={"annotations": ANN, **meta},
              status={"phase": phase}, spec=spec or {})


def test_the_pod_nodeselector_is_indexed_for_class_placement_edits() -> None:
    placed = _entry({}, "Running", {"nodeSelector": {"zone": "a", "example.com/pool": "nvme"}})
    assert placed[("ml", "llama")].node_selector == (("example.com/pool", "nvme"), ("zone", "a"))
    assert _entry({}, "Running")[("ml", "llama")].node_selector == ()


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


def test_a_reader_is_no_drainer_no_writer_and_no_peer() -> None:
    """With one writer, a pod without a writer label is writer 0 to the
    peer tier and a drainer to the bandwidth split: a reader must be neither."""
    from ckptdrain.operator.peers import sync as peer_sync

    reader = {"annotations": ANN, "labels": {"ckptdrain.io/reader": "0"}}
    assert _entry({"labels": reader["labels"]}, "Running") == {}
    from datetime import UTC, datetime

    from ckptdrain.contract import progress as fmt

    claim = fmt.claim_of("Local", 10, ["local"], datetime(2026, 1, 1, tzinfo=UTC))
    said = {**ANN, "ckptdrain.io/progress": fmt.encode(0, 1, {5: claim})}
    progress = getattr(handlers.progress_index, "__wrapped__", handlers.progress_index)
    # What a writer's progress looks like is indexed; the same on a reader is not.
    assert progress(namespace="ml", name="w-0", meta={"annotations": said}, spec={})
    assert progress(namespace="ml", name="r-0", meta={**reader, "annotations": said},
                    spec={}) == {}
    peers = getattr(peer_sync.peer_pod_index, "__wrapped__", peer_sync.peer_pod_index)
    running = {"phase": "Running", "podIP": "10.0.0.9"}
    assert peers(namespace="ml", name="r-0", meta=reader, spec={"nodeName": "n"},
                 status=running) == {}
    writer = peers(namespace="ml", name="w-0", meta={"annotations": ANN},
                   spec={"nodeName": "n"}, status=running)
    assert list(writer) == [("ml", "llama")]
