"""node/kube.py with a recording fake API: the annotations restore leaves on
its own pod (the writer's lease is test_node_lease.py's)."""

from __future__ import annotations

from typing import Any

from ckptdrain.contract.api import ANNOTATION_RESTORED, restored_from
from ckptdrain.node.kube import annotate_own_pod, annotate_own_pod_with


class FakeCore:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.patches: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = []

    def patch_namespaced_pod(self, name: str, ns: str, body: dict[str, Any],
                             **kwargs: Any) -> None:
        if self.fail:
            raise ConnectionError("apiserver down")
        self.patches.append((name, ns, body, kwargs))


def test_restore_annotates_where_it_restored_from() -> None:
    core = FakeCore()
    assert annotate_own_pod("ns", "pod-0", ANNOTATION_RESTORED,
                            restored_from(42, "local"), api=core)
    name, ns, body, _ = core.patches[0]
    assert (name, ns) == ("pod-0", "ns")
    assert body["metadata"]["annotations"] == {"ckptdrain.io/restored-from": "step=42 tier=local"}
    assert restored_from(None, None) == "fresh"
    assert not annotate_own_pod("ns", "pod-0", "k", "v", api=FakeCore(fail=True))


def test_several_annotations_go_in_one_bounded_patch() -> None:
    core = FakeCore()
    assert annotate_own_pod_with("ns", "pod-0", {"a": "1", "b": "2"}, api=core)
    assert len(core.patches) == 1
    _, _, body, kwargs = core.patches[0]
    assert body == {"metadata": {"annotations": {"a": "1", "b": "2"}}}
    assert kwargs.get("_request_timeout")  # a hung apiserver never hangs a restore
    assert not annotate_own_pod_with("ns", "pod-0", {"a": "1"}, api=FakeCore(fail=True))
