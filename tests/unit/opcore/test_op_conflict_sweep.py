"""admission/conflict_sweep.py against an in-memory apiserver: the pass
writes at the version it read and keeps what others wrote meanwhile; an
event compares only its own policy with the others, and only when its
selector or deletion mark changed; a failed write fails the pass (to be
retried) only after trying every policy."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from ckptdrain.operator.admission import conflict_sweep
from ckptdrain.operator.apiserver import kube
from ckptdrain.operator.policy import selectors

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
    monkeypatch.setattr(conflict_sweep, "_graphs", {})
    monkeypatch.setattr(conflict_sweep, "_due", {})
    return found


def events(server: Apiserver) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Each policy's event as the watch delivers it; the index after them."""
    index = server.index()
    for (namespace, _), bodies in index.items():
        conflict_sweep.observe(namespace, bodies[0])
    return index


def condition(server: Apiserver, name: str, kind: str) -> dict[str, Any] | None:
    return next((c for c in server.objects[name]["status"].get("conditions") or []
                 if c["type"] == kind), None)


def test_a_write_that_meets_a_newer_version_reads_again_and_keeps_its_conditions(
        server: Apiserver, monkeypatch: pytest.MonkeyPatch) -> None:
    index = events(server)  # what the pass reads: a moment old
    theirs = {"type": "PodsUnprotected", "status": "True", "reason": "Bare"}
    server.touch("a", {"conditions": [theirs]})
    assert conflict_sweep.mark_namespace("ml", index, LOG) == 2  # type: ignore[arg-type]
    kinds = [c["type"] for c in server.objects["a"]["status"]["conditions"]]
    assert kinds == ["PodsUnprotected", "Conflicting"]
    assert condition(server, "a", "Conflicting")["status"] == "True"  # type: ignore[index]
    assert condition(server, "b", "Conflicting")["status"] == "True"  # type: ignore[index]


def test_overlaps_are_compared_again_only_when_a_selector_changes(
        server: Apiserver, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = selectors.common
    monkeypatch.setattr(selectors, "common", lambda *s: calls.append(1) or real(*s))
    conflict_sweep.mark_namespace("ml", events(server), LOG)  # type: ignore[arg-type]
    assert len(calls) == 1 and server.writes == ["a", "b"]
    # A status change (sizing, a stall, the pass's own write) changes nothing.
    server.touch("b", {"phase": "Conflicting", "drainers": 3})
    assert conflict_sweep.observe("ml", server.index()[("ml", "b")][0]) == set()
    assert len(calls) == 1
    # A status written from an older copy dropped the condition: a pass puts it back.
    server.touch("b", {"conditions": []})
    index = server.index()
    assert conflict_sweep.observe("ml", index[("ml", "b")][0]) == {"b"}
    conflict_sweep.mark_namespace("ml", index, LOG)  # type: ignore[arg-type]
    assert len(calls) == 1 and server.writes == ["a", "b", "b"]
    # A selector changed: compared again, and both clear.
    server.objects["b"]["spec"]["selector"] = {"matchLabels": {"app": "y"}}
    index = server.index()
    assert conflict_sweep.observe("ml", index[("ml", "b")][0]) == {"a", "b"}
    assert conflict_sweep.mark_namespace("ml", index, LOG) == 2  # type: ignore[arg-type]
    assert len(calls) == 2
    assert condition(server, "a", "Conflicting")["status"] == "False"  # type: ignore[index]
    # Overlapping again, then one deleted: the other clears, with no comparison.
    server.objects["b"]["spec"]["selector"] = {"matchLabels": {"app": "x"}}
    conflict_sweep.observe("ml", server.index()[("ml", "b")][0])
    conflict_sweep.mark_namespace("ml", server.index(), LOG)  # type: ignore[arg-type]
    assert condition(server, "a", "Conflicting")["status"] == "True"  # type: ignore[index]
    gone = server.objects.pop("b")
    assert conflict_sweep.observe("ml", gone, deleted=True) == {"a"}
    assert conflict_sweep.mark_namespace("ml", server.index(), LOG) == 1  # type: ignore[arg-type]
    assert len(calls) == 3
    assert condition(server, "a", "Conflicting")["status"] == "False"  # type: ignore[index]
    # Overlapping again, and b deleted while the watch was away (no DELETED
    # event): the pass does not name a policy that is gone.
    server.objects["b"] = gone
    conflict_sweep.observe("ml", server.index()[("ml", "b")][0])
    conflict_sweep.mark_namespace("ml", server.index(), LOG)  # type: ignore[arg-type]
    assert condition(server, "a", "Conflicting")["status"] == "True"  # type: ignore[index]
    del server.objects["b"]
    server.touch("a", {"conditions": []})  # any later event of a
    conflict_sweep.observe("ml", server.index()[("ml", "a")][0])
    conflict_sweep.mark_namespace("ml", server.index(), LOG)  # type: ignore[arg-type]
    assert condition(server, "a", "Conflicting") is None


def test_an_event_among_hundreds_of_policies_compares_its_policy_once_with_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conflict_sweep, "_graphs", {})
    monkeypatch.setattr(conflict_sweep, "_due", {})
    n = 400  # every pair compared would be ~80,000 comparisons per event
    bodies = [policy(f"p{i:04}", {"matchLabels": {"app": f"a{i}"}}) for i in range(n)]
    for body in bodies:
        conflict_sweep.observe("ml", body)
    calls: list[int] = []
    real = selectors.common
    monkeypatch.setattr(selectors, "common", lambda *s: calls.append(1) or real(*s))
    # Its status written (the pass's own write, sizing): no comparison at all.
    bodies[200]["status"] = {"phase": "Ready", "drainers": 4}
    assert conflict_sweep.observe("ml", bodies[200]) == set()
    assert calls == []
    # Its selector changed to meet p0001's: one comparison with each other.
    bodies[200]["spec"]["selector"] = {"matchLabels": {"app": "a1"}}
    assert conflict_sweep.observe("ml", bodies[200]) == {"p0001", "p0200"}
    assert len(calls) <= n - 1
    index = {("ml", b["metadata"]["name"]): [b] for b in bodies}
    assert conflict_sweep.first_overlap("ml", "p0001", index) == (  # type: ignore[arg-type]
        "p0200", {"app": "a1", "ckptdrain.io/inject": "true"})


def test_a_failed_write_fails_the_pass_after_the_others_are_written(
        server: Apiserver) -> None:
    server.fail = {"a"}
    index = events(server)
    with pytest.raises(kube.ApiException):
        conflict_sweep.mark_namespace("ml", index, LOG)  # type: ignore[arg-type]
    assert server.writes == ["b"]
    # The failed one stays due: the retried pass writes it.
    server.fail = set()
    assert conflict_sweep.mark_namespace("ml", server.index(), LOG) == 1  # type: ignore[arg-type]
    assert server.writes == ["b", "a"]
