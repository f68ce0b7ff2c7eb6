"""admission/pod_store.py: the census's store of the opted-in pods, kept by
events and corrected by a LIST that drops the pods deleted unseen, but never
one an event recorded while the LIST ran."""

from __future__ import annotations

from ckptdrain.operator.admission import protection as pr
from ckptdrain.operator.admission.pod_store import PodStore


def _view(name: str, app: str = "a") -> pr.PodView:
    return pr.PodView(name, labels={"app": app})


def test_events_keep_the_store_and_say_when_the_census_changed() -> None:
    store = PodStore()
    assert store.see("ml", "w-0", _view("w-0"), 1.0)
    assert not store.see("ml", "w-0", _view("w-0"), 2.0)  # nothing the census sees
    assert store.see("ml", "w-0", _view("w-0", "b"), 3.0)
    assert store.see("ml", "w-0", None, 4.0)
    assert not store.see("ml", "w-0", None, 5.0)  # already gone
    assert store.views("ml") == [] and store.namespaces() == set()


def test_a_list_drops_ghosts_and_keeps_pods_seen_while_it_ran() -> None:
    store = PodStore()
    store.see("ml", "ghost", _view("ghost"), 1.0)  # deleted while no watch ran
    store.see("ml", "live", _view("live"), 2.0)
    store.see("other", "ghost", _view("ghost"), 3.0)
    store.see("ml", "new", _view("new"), 11.0)  # created while the LIST ran
    dropped = store.reconcile({("ml", "live")}, list_started=10.0)
    assert dropped == {("ml", "ghost"), ("other", "ghost")}
    assert sorted(v.name for v in store.views("ml")) == ["live", "new"]
    assert store.namespaces() == {"ml"}


def test_a_namespaced_list_judges_only_its_namespace() -> None:
    store = PodStore()
    store.see("ml", "ghost", _view("ghost"), 1.0)
    store.see("other", "p", _view("p"), 1.0)
    assert store.reconcile(set(), list_started=10.0, scope="ml") == {("ml", "ghost")}
    assert [v.name for v in store.views("other")] == ["p"]


def test_the_old_pods_deletion_heard_after_its_replacement_leaves_the_replacement() -> None:
    store = PodStore()
    store.see("ml", "w-0", pr.PodView("w-0", labels={"app": "a"}, uid="old"), 1.0)
    store.see("ml", "w-0", pr.PodView("w-0", labels={"app": "a"}, uid="new"), 2.0)
    assert not store.see("ml", "w-0", None, 3.0, uid="old")  # the old pod's DELETED
    assert [v.uid for v in store.views("ml")] == ["new"]
    assert store.see("ml", "w-0", None, 4.0, uid="new")
    assert store.views("ml") == []


def test_the_old_pods_late_update_heard_after_its_replacement_leaves_the_replacement() -> None:
    from datetime import UTC, datetime

    old = pr.PodView("w-0", labels={"app": "a"}, uid="old", agent=pr.RUNNING,
                     created=datetime(2026, 11, 29, 10, tzinfo=UTC))
    new = pr.PodView("w-0", labels={"app": "a"}, uid="new", agent=pr.WAITING,
                     created=datetime(2026, 11, 29, 11, tzinfo=UTC))
    store = PodStore()
    store.see("ml", "w-0", old, 1.0)
    assert store.see("ml", "w-0", new, 2.0)
    assert not store.see("ml", "w-0", old, 3.0)  # the old pod's late MODIFIED
    assert store.views("ml") == [new]
    # The replacement's own updates go on.
    assert store.see("ml", "w-0", pr.PodView(**{**new.__dict__, "agent": pr.RUNNING}), 4.0)
