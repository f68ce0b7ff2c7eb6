"""node/kube.py with recording fake APIs: the agent's record client and
restore's annotation on its own pod."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ckptdrain.contract.api import ANNOTATION_RESTORED, restored_from
from ckptdrain.node.kube import RecordWriter, annotate_own_pod

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


class FakeCore:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.patches: list[dict[str, Any]] = []

    def patch_namespaced_pod(self, name: str, ns: str, body: dict[str, Any], **_: Any) -> None:
        if self.fail:
            raise ConnectionError("apiserver down")
        self.patches.append(body)


class _FakeApi:
    """Records calls; answers create with 409 the second time and a claim on a
    missing record with 404, like the apiserver."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.patched: list[dict[str, Any]] = []

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str,
                                        plural: str, body: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException
        name = body["metadata"]["name"]
        if name in self.created:
            raise ApiException(status=409)
        self.created.append(name)

    def patch_namespaced_custom_object_status(self, *args: Any, **kwargs: Any) -> None:
        from kubernetes.client.exceptions import ApiException
        if args[4] not in self.created:
            raise ApiException(status=404)
        self.patched.append(args[5])


def test_writer_creates_once_and_patches_only_its_claim() -> None:
    api = _FakeApi()
    a = RecordWriter("ns", "pol", 2, "0", api=api)
    b = RecordWriter("ns", "pol", 2, "1", api=api)
    a.report(5, "Local", 10, ["local"], NOW)
    b.report(5, "Local", 10, ["local"], NOW)  # the record is there: the claim alone
    a.report(5, "Global", 10, ["local", "global"], NOW)
    assert api.created == ["pol-s5"]
    assert [list(p["status"]["writers"]) for p in api.patched] == [["0"], ["1"], ["0"]]




def test_restore_annotates_where_it_restored_from() -> None:
    core = FakeCore()
    assert annotate_own_pod("ns", "pod-0", ANNOTATION_RESTORED,
                            restored_from(42, "local"), api=core)
    assert core.patches[0]["metadata"]["annotations"] == {
        "ckptdrain.io/restored-from": "step=42 tier=local"}
    assert restored_from(None, None) == "fresh"
    assert not annotate_own_pod("ns", "pod-0", "k", "v", api=FakeCore(fail=True))
