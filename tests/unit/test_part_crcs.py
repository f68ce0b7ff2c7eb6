"""Part CRC32Cs in manifests: optional, bounded, written by the journal's knowledge only."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ckptdrain import checksum
from ckptdrain.errors import IntegrityError
from ckptdrain.manifest import FileEntry, WriterManifest
from ckptdrain.transfer import journal as jr
from ckptdrain.transfer.partcrcs import agrees, with_part_crcs

ATTEMPT = "0123456789abcdef"
DATA = bytes(range(256)) * 100  # 25,600 bytes: 3 parts of 10,000
PARTS = [DATA[o:o + 10_000] for o in range(0, len(DATA), 10_000)]


def entry(**change: object) -> FileEntry:
    base = FileEntry("big.bin", len(DATA), checksum.to_hex(checksum.crc32c(DATA)), 10_000,
                     tuple(checksum.to_hex(checksum.crc32c(p)) for p in PARTS))
    return dataclasses.replace(base, **change)


def manifest(*files: FileEntry) -> WriterManifest:
    return WriterManifest(step=3, writer=0, writers=1, files=files, created=1.0,
                          part_size=10_000, attempt=ATTEMPT)


def test_part_spans_follow_the_upload() -> None:
    assert entry().part_spans() == [(0, 10_000), (10_000, 10_000), (20_000, 5_600)]
    assert entry(size=0, crc32c="00000000", part_crc32c=("00000000",)).part_spans() == [(0, 0)]


def test_round_trip_and_old_manifests_still_parse() -> None:
    m = manifest(entry())
    assert WriterManifest.from_json(m.to_json()) == m
    assert agrees(m.files[0])
    doc = json.loads(m.to_json())
    del doc["files"][0]["part_crc32c"]  # as written before part CRC32Cs were kept
    old = WriterManifest.from_json(json.dumps(doc).encode())
    assert old.files[0].part_crc32c is None and old.same_content(m)


@pytest.mark.parametrize(("value", "message"), [
    (["00000000"], "lists 1 parts, 25600 bytes in parts of 10000 are 3"),
    ("00000000", "must be a list"),
    (["00000000", "xyz", "00000000"], "part_crc32c"),
    ([1, 2, 3], "entries must be strings"),
])
def test_a_bad_part_list_is_refused_naming_the_field(value: object, message: str) -> None:
    doc = json.loads(manifest(entry()).to_json())
    doc["files"][0]["part_crc32c"] = value
    with pytest.raises(IntegrityError, match=message):
        WriterManifest.from_json(json.dumps(doc).encode())


def test_part_crcs_that_do_not_make_the_file_crc_disagree() -> None:
    swapped = entry().part_crc32c
    assert swapped is not None
    assert not agrees(entry(part_crc32c=(swapped[1], swapped[0], swapped[2])))


def test_the_manifest_gets_what_the_journal_knows_and_only_if_it_agrees(tmp_path: Path) -> None:
    plain = entry(part_crc32c=None)
    small = FileEntry("small.bin", 5, checksum.to_hex(checksum.crc32c(b"hello")), 10_000)
    unknown = dataclasses.replace(plain, path="old.bin")
    j = jr.UploadJournal("s3://b/p", 3, 0, "deadbeef", attempt=ATTEMPT)
    j.file("big.bin", "k1", len(DATA), 10_000)
    j.upload_started("big.bin", "up")
    for n, part in enumerate(PARTS, 1):
        j.part_done("big.bin", jr.PartRecord(n, f"e{n}", checksum.crc32c(part), len(part)))
    j.file_complete("big.bin")
    j.file("small.bin", "k2", 5, 10_000)
    j.file_complete("small.bin", [checksum.crc32c(b"hello")])
    j.file("old.bin", "k3", len(DATA), 10_000)
    j.file_complete("old.bin")  # no parts known (a journal from before they were kept)
    j.file("once.bin", "k4", 5, 10_000)
    j.file_complete("once.bin")  # one part, unjournaled: its CRC32C is the file's
    jr.save(tmp_path / "j", j)
    j = jr.load(tmp_path / "j")
    assert j is not None
    once = dataclasses.replace(small, path="once.bin")
    committed = with_part_crcs(manifest(plain, small, unknown, once), j)
    by_path = {f.path: f for f in committed.files}
    assert by_path["big.bin"].part_crc32c == entry().part_crc32c
    assert by_path["small.bin"].part_crc32c == (small.crc32c,)
    assert by_path["old.bin"].part_crc32c is None
    assert by_path["once.bin"].part_crc32c == (small.crc32c,)
    # A journal whose parts do not make the file's CRC32C adds nothing.
    j.files["big.bin"].part_crcs = [checksum.crc32c(b"other")] * 3
    assert {f.path: f.part_crc32c for f in with_part_crcs(manifest(plain), j).files} == {
        "big.bin": None}


def test_a_journal_without_part_crcs_still_loads(tmp_path: Path) -> None:
    j = jr.UploadJournal("s3://b/p", 3, 0, "deadbeef", attempt=ATTEMPT)
    j.file("a", "k", 5, 10)
    j.file_complete("a", [7])
    doc = json.loads(j.to_json())
    del doc["files"]["a"]["part_crcs"]
    (tmp_path / "j").write_text(json.dumps(doc))
    again = jr.load(tmp_path / "j")
    assert again is not None and again.files["a"].complete
    assert again.files["a"].part_crcs is None


@pytest.mark.parametrize("bad", [-1, 1 << 32, True])
def test_a_journal_with_an_impossible_part_crc_is_unreadable_not_a_failed_commit(
        tmp_path: Path, bad: object) -> None:
    # A damaged journal is started afresh; one that loaded would make every
    # commit of the step fail when its CRC became a manifest entry.
    j = jr.UploadJournal("s3://b/p", 3, 0, "deadbeef", attempt=ATTEMPT)
    j.file("small.bin", "k", 5, 10_000)
    j.file_complete("small.bin", [checksum.crc32c(b"hello")])
    doc = json.loads(j.to_json())
    doc["files"]["small.bin"]["part_crcs"] = [bad]
    (tmp_path / "j").write_text(json.dumps(doc))
    assert jr.load(tmp_path / "j") is None
