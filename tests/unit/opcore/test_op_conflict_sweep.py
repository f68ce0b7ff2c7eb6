"""admission/conflict_sweep.py against an in-memory apiserver: the pass
writes at the version it read and keeps what others wrote meanwhile, finds
overlaps again only when the namespace's selectors changed, and fails (to
be retried) only after trying every policy."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from ckptdrain.operator.admission import conflict_sweep
from ckptdrain.operator.apiserver import kube
from ckptdrain.operator.policy import conflicts

LOG = logging.getLogger("test")


class Apiserver:
    """Policies by name with a resourceVersion bumped on every write."""

    def __init__(self, *bodies: dict[str, Any]) -> None:
        self.objects = {b["metadata"]["name"]: b for b in bodies}
        self.writes: list[str] = []
        self.fail: set[str] = set()

    def index(self) -> dict[tuple[str, str], list[dict[str, Any]]]:
        return {("ml", n): [copy.deepcopy(b)] for n, b in self.objects.items()}

    def touch(self, name: str, status: dict[str, Any]) -> None:
        """Another writer's status merge (a list is replaced whole)."""
        body = self.objects[name]
        body["status"] = {**(body.get("status") or {}), **status}
        body["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)

    def patch_status_at(self, plural: str, namespace: str, name: str, status: dict[str, Any],
                        version: str) -> str:
        if name in self.fail:
            raise kube.ApiException(status=500, reason="etcd down")
        if name not in self.objects:
            return "gone"
        if self.objects[name]["metadata"]["resourceVersion"] != version:
            return "conflict"
        self.writes.append(name)
        self.touch(name, status)
        return "ok"

    def read_own(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        body = self.objects.get(name)
        return copy.deepcopy(body) if body else None


def policy(name: str, selector: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "generation": 1,
                         "resourceVersion": "1"},
            "spec": {"selector": selector}, "status": {}}


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Apiserver:
    found = Apiserver(policy("a", {"matchLabels": {"app": "x"}}),
                      policy("b", {"matchExpressions": [{"key": "app", "operator": "Exists"}]}))
    monkeypatch.setattr(kube, "patch_status_at", found.patch_status_at)
    monkeypatch.setattr(kube, "read_own", found.read_own)
    monkeypatch.setattr(conflict_sweep, "_found", {})
    return found


def condition(server: Apiserver, name: str, kind: str) -> dict[str, Any] | None:
    return next((c for c in server.objects[name]["status"].get("conditions") or []
                 if c["type"] == kind), None)


def test_a_write_that_meets_a_newer_version_reads_again_and_keeps_its_conditions(
        server: Apiserver, monkeypatch: pytest.MonkeyPatch) -> None:
    index = server.index()  # what the pass reads: a moment old
    theirs = {"type": "PodsUnprotected", "status": "True", "reason": "Bare"}
    server.touch("a", {"conditions": [theirs]})
    assert conflict_sweep.mark_namespace("ml", index, LOG) == 2  # type: ignore[arg-type]
    kinds = [c["type"] for c in server.objects["a"]["status"]["conditions"]]
    assert kinds == ["PodsUnprotected", "Conflicting"]
    assert condition(server, "a", "Conflicting")["status"] == "True"  # type: ignore[index]
    assert condition(server, "b", "Conflicting")["status"] == "True"  # type: ignore[index]


def test_overlaps_are_found_again_only_when_the_selectors_change(
        server: Apiserver, monkeypatch: pytest.MonkeyPatch) -> None:
    finds: list[int] = []
    real = conflicts.find
    monkeypatch.setattr(conflicts, "find", lambda bodies: finds.append(1) or real(bodies))
    conflict_sweep.mark_namespace("ml", server.index(), LOG)  # type: ignore[arg-type]
    assert len(finds) == 1 and server.writes == ["a", "b"]
    # A status change (sizing, a stall) leaves the overlaps as they were.
    server.touch("b", {"phase": "Conflicting", "drainers": 3})
    index = server.index()
    body = index[("ml", "b")][0]
    assert not conflict_sweep.pass_needed("ml", body, index)  # type: ignore[arg-type]
    conflict_sweep.mark_namespace("ml", index, LOG)  # type: ignore[arg-type]
    assert len(finds) == 1 and server.writes == ["a", "b"]
    # A status written from an older copy dropped the condition: a pass puts it back.
    server.touch("b", {"conditions": []})
    index = server.index()
    assert conflict_sweep.pass_needed("ml", index[("ml", "b")][0], index)  # type: ignore[arg-type]
    conflict_sweep.mark_namespace("ml", index, LOG)  # type: ignore[arg-type]
    assert len(finds) == 1 and server.writes == ["a", "b", "b"]
    # A selector changed: found again, and both clear.
    server.objects["b"]["spec"]["selector"] = {"matchLabels": {"app": "y"}}
    index = server.index()
    assert conflict_sweep.pass_needed("ml", index[("ml", "a")][0], index)  # type: ignore[arg-type]
    assert conflict_sweep.mark_namespace("ml", index, LOG) == 0  # type: ignore[arg-type]
    assert len(finds) == 2
    assert condition(server, "a", "Conflicting")["status"] == "False"  # type: ignore[index]


def test_a_failed_write_fails_the_pass_after_the_others_are_written(
        server: Apiserver) -> None:
    server.fail = {"a"}
    with pytest.raises(kube.ApiException):
        conflict_sweep.mark_namespace("ml", server.index(), LOG)  # type: ignore[arg-type]
    assert server.writes == ["b"]
