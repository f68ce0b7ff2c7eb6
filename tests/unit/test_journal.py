"""The upload journal: pure transitions, atomic save, and the drain's part sizing."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.transfer import journal as jr
from ckptdrain.transfer.drain import MAX_PARTS, Drainer


def journal() -> jr.UploadJournal:
    j = jr.UploadJournal("s3://b/p", 7, 0, "deadbeef")
    j.file("a.bin", "data/a.bin", 30, 10)
    j.upload_started("a.bin", "up-1")
    for n in (1, 2):
        j.part_done("a.bin", jr.PartRecord(n, f'"etag{n}"', n * 11, 10))
    return j


def test_round_trip_and_atomic_save(tmp_path: Path) -> None:
    j = journal()
    jr.save(tmp_path / "j.json", j)
    again = jr.load(tmp_path / "j.json")
    assert again is not None and again.to_json() == j.to_json()
    assert again.open_uploads() == [("data/a.bin", "up-1")]
    assert again.done_bytes == 20
    assert [p.name for p in tmp_path.iterdir()] == ["j.json"]  # no temp file left


def test_unreadable_journal_means_start_over(tmp_path: Path) -> None:
    (tmp_path / "j.json").write_text("{half a journ")
    assert jr.load(tmp_path / "j.json") is None
    assert jr.load(tmp_path / "missing.json") is None


@pytest.mark.parametrize("damage", ["files-list", "size-infinity", "deep-nesting"])
def test_any_damage_to_a_journal_means_start_over(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    doc = json.loads(journal().to_json())
    if damage == "files-list":
        doc["files"] = []
        body = json.dumps(doc)
    elif damage == "size-infinity":
        doc["files"]["a.bin"]["size"] = float("inf")
        body = json.dumps(doc)  # writes the bare Infinity that json.loads reads back
    else:
        body = "[" * 100_000 + "]" * 100_000
    (tmp_path / "j.json").write_text(body)
    with caplog.at_level(logging.WARNING, logger="ckptdrain.transfer.journal"):
        assert jr.load(tmp_path / "j.json") is None
    assert len(caplog.records) == 1 and "starting a fresh attempt" in caplog.text
    assert "Traceback" not in caplog.text


def test_parts_the_store_lost_are_forgotten() -> None:
    j = journal()
    j.keep_parts("a.bin", {1: "etag1", 2: '"other"'})  # quotes do not matter, etags do
    assert set(j.files["a.bin"].parts) == {1}


def test_changed_file_restarts_its_state() -> None:
    j = journal()
    assert j.file("a.bin", "data/a.bin", 30, 10).parts  # same file: kept
    assert not j.file("a.bin", "data/a.bin", 31, 10).parts  # size changed: fresh


def test_complete_and_lost_uploads() -> None:
    j = journal()
    j.upload_lost("a.bin")
    assert j.files["a.bin"].upload_id is None and not j.files["a.bin"].parts
    j.file_complete("a.bin")
    assert j.open_uploads() == [] and j.done_bytes == 30
    assert not j.matches("s3://b/p", 8, 0, "deadbeef") and j.matches("s3://b/p", 7, 0, "deadbeef")


class _NoStore:
    uri = "none://"
    min_part_size = 5 << 20


@given(st.integers(0, 2**45))
def test_part_size_keeps_every_file_within_s3s_part_limit(size: int) -> None:
    drainer = Drainer(_NoStore(), part_size=8 << 20)  # type: ignore[arg-type]
    part = drainer.part_size_for(size)
    assert part >= 8 << 20
    assert -(-size // part) <= MAX_PARTS


def test_the_attempt_survives_a_save_and_old_journals_start_over(tmp_path: Path) -> None:
    j = jr.UploadJournal("file:///s", 7, 0, "deadbeef")
    assert len(j.attempt) == 17 and j.attempt.startswith("s")  # the spread layout
    assert j.attempt != jr.UploadJournal("file:///s", 7, 0, "x").attempt
    jr.save(tmp_path / "j", j)
    loaded = jr.load(tmp_path / "j")
    assert loaded is not None and loaded.attempt == j.attempt
    doc = json.loads(j.to_json())
    doc["attempt"] = "../escape"
    (tmp_path / "bad").write_text(json.dumps(doc))
    assert jr.load(tmp_path / "bad") is None  # never a key from a journal's free string
    doc.update(format=1)
    del doc["attempt"]
    (tmp_path / "old").write_text(json.dumps(doc))
    assert jr.load(tmp_path / "old") is None  # keys of the layout without attempts
