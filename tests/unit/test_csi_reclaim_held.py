"""Reclaim records the driver cannot trust hold the directory: a record that
does not read or parse, one naming a class whose reclaim was never read
(the LIST never succeeded), a record that could not be written. Never the
driver's setting for them (it could delete at once what a Retain class kept
for days). Also what is recorded when, and what is not rewritten."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import pytest
from tests.unit.test_csi_class_reclaim import (
    DRIVER,
    PROD,
    RESEARCH,
    Api,
    collector,
    policy_dir,
    reclaim_of,
)

from ckptdrain.csi import class_reclaim, volumes
from ckptdrain.csi import collector as collector_module
from ckptdrain.csi.class_reclaim import RECLAIM_FILE
from ckptdrain.csi.collection import DELETE, RETAIN, Recorded, Verdict
from ckptdrain.csi.metrics import registry_for
from ckptdrain.csi.volumes import PolicyFound, write_file

WEEK = 7 * 86400


def retain_policy_scanned(tmp_path: Path) -> tuple[Api, Path, collector_module.Collector]:
    """A Retain class's policy, present, its directory scanned once."""
    api = Api()
    api.classes = {"prod": reclaim_of({"policy": "Retain"})}
    api.policies = {("team-a", "p"): PolicyFound(PROD, "prod")}
    directory = policy_dir(tmp_path, PROD, "p")
    gc = collector(tmp_path, api)
    gc.scan()
    return api, directory, gc


def retained_a_week(tmp_path: Path) -> tuple[Api, Path, collector_module.Collector]:
    """A Retain class's directory whose policy went a week ago."""
    api, directory, gc = retain_policy_scanned(tmp_path)
    api.policies = {}
    for _ in range(8):
        gc.scan()
        api.now += WEEK / 8
    return api, directory, gc


@pytest.mark.parametrize("broken", [
    '{"version": 1, "class": "prod", "known": true, "policy": "Retain"',  # cut short
    json.dumps({"version": 1, "class": "prod", "known": True, "policy": "Recycle",
                "gracePeriodSeconds": None}),
    json.dumps({"version": 9, "class": "prod", "known": True, "policy": "Retain",
                "gracePeriodSeconds": None}),
])
def test_a_record_that_does_not_parse_holds_the_directory_and_says_so_each_scan(
        tmp_path: Path, broken: str, caplog: pytest.LogCaptureFixture) -> None:
    api, directory, gc = retained_a_week(tmp_path)
    (directory / RECLAIM_FILE).write_text(broken)
    caplog.set_level(logging.WARNING, logger="ckptdrain.csi.collector")
    for _ in range(2):
        api.now += 60
        report = gc.scan()
        assert directory.exists()
        assert [p.verdict for p in report.policies] == [Verdict.RETAINED]
        assert report.held_records == 1
    assert caplog.text.count("an unreadable record") == 2
    assert registry_for(gc).get_sample_value("ckptdrain_csi_held_reclaim_records") == 1
    # Mended: the clock ran on, and the class's word applies again.
    (directory / RECLAIM_FILE).write_text(class_reclaim.dumps(Recorded("prod", DELETE, 60.0)))
    api.now += 60
    assert gc.scan().held_records == 0
    assert not directory.exists()


def test_a_record_that_cannot_be_read_holds_the_directory(tmp_path: Path) -> None:
    api, directory, gc = retained_a_week(tmp_path)
    (directory / RECLAIM_FILE).unlink()
    (directory / RECLAIM_FILE).mkdir()  # read_text: IsADirectoryError
    api.now += 60
    assert [p.verdict for p in gc.scan().policies] == [Verdict.RETAINED]
    # No record at all is data from before records: the driver's setting.
    (directory / RECLAIM_FILE).rmdir()
    api.now += 60
    assert [p.verdict for p in gc.scan().policies] == [Verdict.PENDING]


def test_a_class_never_listed_is_recorded_by_name_and_its_directory_held(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    api = Api()
    api.classes = {"prod": reclaim_of({"policy": "Retain"})}
    api.refuse_classes = True
    api.policies = {("team-a", "p"): PolicyFound(PROD, "prod"),
                    ("team-a", "r"): PolicyFound(RESEARCH, "prod")}
    dirs = [policy_dir(tmp_path, PROD, "p"), policy_dir(tmp_path, RESEARCH, "r")]
    gc = collector(tmp_path, api)
    caplog.set_level(logging.WARNING, logger="ckptdrain.csi.collector")
    report = gc.scan()
    assert caplog.text.count("listing CheckpointClasses: HTTP 403") == 1  # once per scan
    assert report.class_list_failed
    assert registry_for(gc).get_sample_value("ckptdrain_csi_class_list_failed") == 1
    for directory in dirs:
        assert class_reclaim.loads((directory / RECLAIM_FILE).read_text()) == \
            Recorded("prod", known=False)
    api.policies = {}
    for _ in range(3):
        api.now += 2 * 3600  # past the driver's hour, many times
        report = gc.scan()
    assert all(d.exists() for d in dirs)
    assert {p.verdict for p in report.policies} == {Verdict.RETAINED}
    assert report.held_records == 2
    assert "its reclaim never read: held" in caplog.text


def test_a_class_not_found_or_not_parsing_records_it_held_and_keeps_a_known_record(
        tmp_path: Path) -> None:
    api = Api()
    api.policies = {("team-a", "p"): PolicyFound(PROD, "prod")}
    directory = policy_dir(tmp_path, PROD, "p")
    gc = collector(tmp_path, api)
    gc.scan()  # no class "prod" listed
    assert class_reclaim.loads((directory / RECLAIM_FILE).read_text()) == \
        Recorded("prod", known=False)
    api.classes = {"prod": reclaim_of({"policy": "Retain", "gracePeriod": "2h"})}
    gc.scan()
    assert class_reclaim.loads((directory / RECLAIM_FILE).read_text()) == \
        Recorded("prod", RETAIN, 7200.0)
    api.classes = {"prod": reclaim_of({"policy": "Recycle"})}
    gc.scan()  # does not parse: the known record holds
    assert class_reclaim.loads((directory / RECLAIM_FILE).read_text()) == \
        Recorded("prod", RETAIN, 7200.0)


def test_only_a_present_policy_records_and_an_unchanged_record_is_not_rewritten(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api, directory, gc = retain_policy_scanned(tmp_path)
    writes: list[str] = []
    monkeypatch.setattr(collector_module, "write_file",
                        lambda path, text: writes.append(path.name) or write_file(path, text))
    gc.scan()
    assert RECLAIM_FILE not in writes
    # Deleted and created again with another uid: a DELETED sighting of
    # this directory, whose record must stay the first policy's.
    api.classes["other"] = reclaim_of({"policy": "Delete"})
    api.policies = {("team-a", "p"): PolicyFound(RESEARCH, "other")}
    gc.scan()
    assert RECLAIM_FILE not in writes
    assert class_reclaim.loads((directory / RECLAIM_FILE).read_text()) == \
        Recorded("prod", RETAIN)


def test_a_record_that_cannot_be_written_leaves_the_old_one_and_the_scan_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    api, directory, gc = retain_policy_scanned(tmp_path)
    api.classes = {"prod": reclaim_of({"policy": "Delete"})}

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(volumes.os, "fsync", lambda fd: full(fd, b""))
    caplog.set_level(logging.WARNING, logger="ckptdrain.csi.collector")
    report = gc.scan()
    assert [p.policy_name for p in report.policies] == ["p"]
    assert "reclaim not recorded" in caplog.text and "No space left" in caplog.text
    assert class_reclaim.loads((directory / RECLAIM_FILE).read_text()) == \
        Recorded("prod", RETAIN)
    assert sorted(p.name for p in directory.iterdir()) == ["data", "owner.json", RECLAIM_FILE]


def test_a_resolver_answering_a_bare_uid_is_refused_not_taken_as_classless(
        tmp_path: Path) -> None:
    """One resolver type: a bare uid carries no class, and taken as one it
    would switch reclaim per class off without a word."""
    assert volumes.uid_of(PolicyFound(PROD, "prod")) == PROD and volumes.uid_of(None) is None
    directory = policy_dir(tmp_path, PROD, "p")
    store = volumes.VolumeStore(tmp_path, lambda ns, name: PROD,  # type: ignore[arg-type,return-value]
                                mounter=None)  # type: ignore[arg-type]
    gc = collector_module.Collector(store, store.resolve_policy, DRIVER, 1.0, lambda d: False,
                                    list_classes=dict)
    with pytest.raises(TypeError, match="must answer a PolicyFound or None, not str"):
        gc.scan()
    assert not (directory / RECLAIM_FILE).exists()
