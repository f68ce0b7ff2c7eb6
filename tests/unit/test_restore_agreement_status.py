"""The ranks' restore agreement, from each pod's restore result to the policy status."""

from __future__ import annotations

from ckptdrain import restore_status
from ckptdrain.contract.api import ANNOTATION_RESTORE_RESULT
from ckptdrain.contract.goodput import PodView, parse_restore
from ckptdrain.restore.annotations import pod_annotations
from ckptdrain.restore.result import RestoreResult


def _view(name: str, round_: int, step: int | None, why: str = "agreed") -> PodView:
    result = RestoreResult(False, 0, 2, 1000.0, outcome="restored", step=step, tier="local",
                           seconds=2.0)
    result.agreement = {"round": round_, "step": step, "why": why,
                        "detail": f"every rank reported; step {step}", "how": "adopted"}
    text = pod_annotations(result, 0, 1010.0)[ANNOTATION_RESTORE_RESULT]
    return PodView(name=name, writer="0", restore=parse_restore(text))


def test_the_status_names_the_newest_round_and_how_many_pods_restored_it() -> None:
    pods = [_view("a", 3, 100), _view("b", 4, 120), _view("c", 4, 120)]
    assert restore_status.restore_agreement(pods) == {
        "round": 4, "step": 120, "why": "agreed", "detail": "every rank reported; step 120",
        "pods": 2, "startedAt": 1008.0}


def test_no_agreement_without_coordinated_restores() -> None:
    plain = RestoreResult(False, 0, 1, 1000.0, outcome="restored", step=5, tier="global")
    view = PodView(name="a", writer="0", restore=parse_restore(
        pod_annotations(plain, 0, 1001.0)[ANNOTATION_RESTORE_RESULT]))
    assert view.restore is not None and view.restore.agreement is None
    assert restore_status.restore_agreement([view]) is None
    assert parse_restore('{"outcome":"restored","startedAt":1,"agreement":{"round":-1,'
                         '"why":"agreed"}}').agreement is None  # type: ignore[union-attr]


def test_a_step_whose_writers_saved_it_in_different_runs_is_not_one_checkpoint() -> None:
    import pytest

    from ckptdrain.manifest import FileEntry, IntegrityError, WriterManifest, check_consistent

    def m(writer: int, timeline: str) -> WriterManifest:
        return WriterManifest(step=7, writer=writer, writers=2, created=1.0,
                              files=(FileEntry("a.bin", 1, "0000abcd"),),
                              extra={"timeline": timeline} if timeline else {})
    check_consistent([m(0, "r1-a"), m(1, "r1-a")])
    check_consistent([m(0, "r1-a"), m(1, "")])  # untagged: written before timelines
    with pytest.raises(IntegrityError, match="different runs"):
        check_consistent([m(0, "r1-a"), m(1, "r2-b")])
