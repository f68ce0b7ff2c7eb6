"""Reclaim per CheckpointClass on the driver: the pure rule (what a class
says, what applies to a directory) and the collector recording it while the
policy is there and using the record once it is gone (a real directory
tree; dicts stand in for the apiserver, tests/cluster/test_csi_class_reclaim_apiserver.py
has the real one)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from ckptdrain.csi import class_reclaim
from ckptdrain.csi.class_reclaim import RECLAIM_FILE
from ckptdrain.csi.collection import (
    DELETE,
    RETAIN,
    DeletedClock,
    Reclaim,
    Recorded,
    Sighting,
    Unreadable,
    Verdict,
    decide,
    effective,
)
from ckptdrain.csi.collector import Collector
from ckptdrain.csi.requests import Refused
from ckptdrain.csi.volumes import Owner, PolicyFound, VolumeStore
from ckptdrain.errors import InvalidInput

SCAN = 1.0  # the scan interval (s)
DRIVER = Reclaim(DELETE, 3600.0)
RESEARCH = "11111111-1111-4111-8111-111111111111"
PROD = "22222222-2222-4222-8222-222222222222"
PLAIN = "33333333-3333-4333-8333-333333333333"


def test_the_class_fields_win_over_the_drivers_and_each_unset_one_keeps_the_drivers() -> None:
    assert effective(None, DRIVER) == (DRIVER, "the driver's setting")
    assert effective(Recorded("bare"), DRIVER) == (DRIVER, "the driver's setting")
    assert effective(Recorded("prod", RETAIN), DRIVER) == (Reclaim(RETAIN, 3600.0), "class prod")
    assert effective(Recorded("fast", None, 30.0), DRIVER) == (Reclaim(DELETE, 30.0),
                                                               "class fast")


def test_the_same_sightings_delete_one_directory_and_keep_the_other_by_their_reclaim() -> None:
    clock = DeletedClock(0.0, 50.0)
    research, _ = effective(Recorded("research", DELETE, 60.0), DRIVER)
    prod, _ = effective(Recorded("prod", RETAIN), DRIVER)
    assert decide(Sighting.DELETED, clock, False, 100.0, research, SCAN).verdict is Verdict.DELETE
    assert decide(Sighting.DELETED, clock, False, 100.0, prod, SCAN).verdict is Verdict.RETAINED
    # Under the driver's hour the same run is only pending.
    assert decide(Sighting.DELETED, clock, False, 100.0, DRIVER, SCAN).verdict is Verdict.PENDING


def test_a_class_is_read_field_by_field_and_a_wrong_one_is_named() -> None:
    spec = {"nodeTier": {"root": "/x", "reclaim": {"policy": "Retain", "gracePeriod": "1h30m"}}}
    assert class_reclaim.from_class("prod", spec) == Recorded("prod", RETAIN, 5400.0)
    assert class_reclaim.from_class("bare", {"nodeTier": {"root": "/x"}}) == Recorded("bare")
    with pytest.raises(InvalidInput, match=r"CheckpointClass odd spec\.nodeTier\.reclaim\.policy"
                       r".*Delete or Retain"):
        class_reclaim.from_class("odd", {"nodeTier": {"reclaim": {"policy": "Recycle"}}})
    with pytest.raises(InvalidInput, match=r"spec\.nodeTier\.reclaim\.gracePeriod"):
        class_reclaim.from_class("odd", {"nodeTier": {"reclaim": {"gracePeriod": "soon"}}})


def test_a_record_reads_back_and_a_broken_one_is_unreadable_never_none() -> None:
    for recorded in (Recorded("prod", RETAIN), Recorded("fast", None, 30.0), Recorded("b"),
                     Recorded("gone", known=False)):
        assert class_reclaim.loads(class_reclaim.dumps(recorded)) == recorded
    good = {"version": 1, "class": "x", "known": True, "policy": None,
            "gracePeriodSeconds": None}
    for text in ("", "{", "[]", '{"class": "x"}', json.dumps({**good, "version": 2}),
                 json.dumps({k: v for k, v in good.items() if k != "version"}),
                 json.dumps({**good, "policy": "Recycle"}),
                 json.dumps({**good, "gracePeriodSeconds": -1}),
                 json.dumps({**good, "gracePeriodSeconds": True}),
                 json.dumps({**good, "class": ""}), json.dumps({**good, "known": 1})):
        assert isinstance(class_reclaim.loads(text), Unreadable), text
    unknown = class_reclaim.loads(json.dumps({**good, "policy": "Recycle"}))
    assert isinstance(unknown, Unreadable) and "Recycle" in unknown.reason


class Api:
    """The apiserver as the collector sees it: policies and classes."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.policies: dict[tuple[str, str], PolicyFound] = {}
        self.classes: dict[str, Mapping[str, Any]] = {}
        self.refuse_classes = False
        self.lists = 0

    def resolve(self, namespace: str, name: str) -> PolicyFound | None:
        return self.policies.get((namespace, name))

    def list_classes(self) -> Mapping[str, Mapping[str, Any]]:
        self.lists += 1
        if self.refuse_classes:
            raise Refused("UNAVAILABLE", "listing CheckpointClasses: HTTP 403 Forbidden")
        return dict(self.classes)


def policy_dir(root: Path, uid: str, name: str) -> Path:
    directory = root / "team-a" / uid
    (directory / "data").mkdir(parents=True)
    (directory / "owner.json").write_text(Owner("team-a", uid, name, 2000).to_json())
    return directory


def collector(root: Path, api: Api) -> Collector:
    store = VolumeStore(root, api.resolve, mounter=None)  # type: ignore[arg-type]
    return Collector(store, api.resolve, DRIVER, 1.0, lambda d: False, clock=lambda: api.now,
                     list_classes=api.list_classes)


def reclaim_of(tier: Mapping[str, Any]) -> dict[str, Any]:
    return {"nodeTier": {"root": "/x", "reclaim": tier}}


@pytest.fixture
def three(tmp_path: Path) -> tuple[Api, dict[str, Path]]:
    """Policies of a Delete-after-30s class, a Retain class and no class."""
    api = Api()
    api.classes = {"research": reclaim_of({"policy": "Delete", "gracePeriod": "30s"}),
                   "prod": reclaim_of({"policy": "Retain"})}
    api.policies = {("team-a", "r"): PolicyFound(RESEARCH, "research"),
                    ("team-a", "p"): PolicyFound(PROD, "prod"),
                    ("team-a", "n"): PolicyFound(PLAIN, None)}
    dirs = {"r": policy_dir(tmp_path, RESEARCH, "r"), "p": policy_dir(tmp_path, PROD, "p"),
            "n": policy_dir(tmp_path, PLAIN, "n")}
    return api, dirs


def test_each_directory_goes_as_its_class_said_once_its_policy_is_gone(
        tmp_path: Path, three: tuple[Api, dict[str, Path]],
        caplog: pytest.LogCaptureFixture) -> None:
    api, dirs = three
    gc = collector(tmp_path, api)
    gc.scan()
    assert api.lists == 1  # one LIST for every directory of the scan
    assert class_reclaim.loads((dirs["r"] / RECLAIM_FILE).read_text()) == \
        Recorded("research", DELETE, 30.0)
    assert class_reclaim.loads((dirs["p"] / RECLAIM_FILE).read_text()) == Recorded("prod", RETAIN)
    assert not (dirs["n"] / RECLAIM_FILE).exists()
    # All three deleted, and both classes with them: the records hold.
    api.policies, api.classes = {}, {}
    caplog.set_level(logging.INFO, logger="ckptdrain.csi.collector")
    gc.scan()
    api.now += 30
    report = gc.scan()
    assert not dirs["r"].exists()
    assert {p.policy_name: p.verdict for p in report.policies} == {
        "p": Verdict.RETAINED, "n": Verdict.PENDING}
    text = caplog.text
    assert "kept (reclaim Retain) (reclaim from class prod)" in text
    assert "(reclaim Delete from class research)" in text
    assert "deleted after 3600 s of sightings unless it comes back (reclaim from the " \
           "driver's setting)" in text


def test_a_class_that_cannot_be_read_changes_nothing_recorded(
        tmp_path: Path, three: tuple[Api, dict[str, Path]]) -> None:
    api, dirs = three
    gc = collector(tmp_path, api)
    gc.scan()
    before = (dirs["r"] / RECLAIM_FILE).read_text()
    # The class turns Retain, but the LIST is refused: the record holds.
    api.classes["research"] = reclaim_of({"policy": "Retain"})
    api.refuse_classes = True
    gc.scan()
    assert (dirs["r"] / RECLAIM_FILE).read_text() == before
    # The class deleted before its policy: the record holds too.
    api.refuse_classes = False
    del api.classes["research"]
    gc.scan()
    assert (dirs["r"] / RECLAIM_FILE).read_text() == before
    # Read again: the class's new word is recorded.
    api.classes["research"] = reclaim_of({"policy": "Retain"})
    gc.scan()
    assert class_reclaim.loads((dirs["r"] / RECLAIM_FILE).read_text()) == \
        Recorded("research", RETAIN)
    assert api.lists == 4


def test_data_without_a_record_falls_to_the_drivers_setting(
        tmp_path: Path, three: tuple[Api, dict[str, Path]]) -> None:
    api, _ = three
    api.policies = {}  # gone before any scan read its class
    gc = collector(tmp_path, api)
    gc.scan()
    api.now += 30
    assert {p.policy_name: p.verdict for p in gc.scan().policies} == {
        "r": Verdict.PENDING, "p": Verdict.PENDING, "n": Verdict.PENDING}
    assert api.lists == 0  # no policy there: no class to read


def test_a_pending_directory_is_due_after_its_own_grace_and_its_first_sighting_stays_true(
        tmp_path: Path) -> None:
    """The overdue alert counts from the due time, the first sighting plus
    the directory's own grace; the oldest pending time is the sighting."""
    api = Api()
    api.classes = {"slow": reclaim_of({"gracePeriod": "7d"})}
    api.policies = {("team-a", "r"): PolicyFound(RESEARCH, "slow")}
    policy_dir(tmp_path, RESEARCH, "r")
    gc = collector(tmp_path, api)
    gc.scan()
    api.policies = {}
    report = gc.scan()
    assert report.policies[0].verdict is Verdict.PENDING
    assert report.oldest_pending_since() == api.now
    assert report.earliest_pending_due() == api.now + 7 * 86400
    policy_dir(tmp_path, PROD, "p")  # no record: the driver's hour
    api.now += 10
    report = gc.scan()
    assert report.oldest_pending_since() == api.now - 10
    assert report.earliest_pending_due() == api.now + DRIVER.grace_s
