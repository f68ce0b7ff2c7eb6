"""Prefix spreading (keys.py): writers spread over prefixes, keys derived, old layouts read."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from ckptdrain import keys
from ckptdrain.errors import IntegrityError
from ckptdrain.manifest import FORMAT_VERSION, FileEntry, WriterManifest

OLD = "0123456789abcdef"


def test_new_attempts_are_spread_and_their_keys_start_with_the_writers_hash() -> None:
    attempt = keys.new_attempt()
    assert re.fullmatch(r"s[0-9a-f]{16}", attempt)
    key = keys.data_key(12, 7, "model/rank7.pt", attempt)
    assert key == f"data/{keys.spread(7)}/{12:020d}/00007/{attempt}/model/rank7.pt"
    assert keys.parse_data_key(key) == (12, 7)


def test_old_attempts_and_format_1_keep_their_layout() -> None:
    assert keys.data_key(12, 7, "a.bin", OLD) == f"data/{12:020d}/00007/{OLD}/a.bin"
    assert keys.data_key(12, 7, "a.bin", None) == f"data/{12:020d}/00007/a.bin"
    assert keys.parse_data_key(keys.data_key(12, 7, "a.bin", OLD)) == (12, 7)


def test_thousands_of_writers_fall_evenly_into_256_prefixes() -> None:
    per_prefix = Counter(keys.spread(w) for w in range(4096))
    assert len(per_prefix) == 256
    assert max(per_prefix.values()) <= 3 * 4096 / 256  # no hot prefix


def test_a_spread_key_under_another_writers_prefix_is_nobodys() -> None:
    wrong = next(h for h in ("00", "01") if h != keys.spread(7))
    assert keys.parse_data_key(f"data/{wrong}/{1:020d}/00007/s{OLD}/a") is None


def test_the_writer_prefixes_cover_both_layouts() -> None:
    spread_prefix, old_prefix = keys.writer_data_prefixes(3, 7)
    assert keys.data_key(3, 7, "a", "s" + OLD).startswith(spread_prefix)
    assert keys.data_key(3, 7, "a", OLD).startswith(old_prefix)


def _manifest(attempt: str | None) -> WriterManifest:
    return WriterManifest(step=1, writer=0, writers=1, created=0.0, attempt=attempt,
                          part_size=1 << 20 if attempt else None,
                          files=(FileEntry("a.bin", 3, "00000000",
                                           part_size=(1 << 20) if attempt else None),))


@pytest.mark.parametrize(("attempt", "fmt"), [("s" + OLD, 3), (OLD, 2), (None, 1)])
def test_the_manifest_format_says_the_layout_and_round_trips(attempt: str | None,
                                                             fmt: int) -> None:
    m = _manifest(attempt)
    assert m.format == fmt
    assert WriterManifest.from_json(m.to_json()) == m


def test_a_new_attempt_writes_the_current_format() -> None:
    assert _manifest(keys.new_attempt()).format == FORMAT_VERSION


def test_a_format_that_disagrees_with_its_attempt_is_refused() -> None:
    doc = _manifest("s" + OLD).to_json().replace(b'"format":3', b'"format":2')
    assert b'"format":2' in doc
    with pytest.raises(IntegrityError, match="other layout"):
        WriterManifest.from_json(doc)


def _long_path(n: int) -> str:
    """A relative path of exactly `n` bytes, in names a filesystem takes."""
    names, left = [], n
    while left > 201:
        names.append("d" * 200)
        left -= 201
    return "/".join([*names, "f" * left])


def test_a_baseline_manifest_at_the_old_key_limit_still_parses() -> None:
    # The baseline release accepted paths up to 1024 minus its data prefix
    # (no spread level, no "s"): 975 bytes. Its manifests must keep restoring.
    longest = 1024 - len(f"data/{0:020d}/00000/{OLD}/")
    path = _long_path(longest)
    for attempt, part_size in ((OLD, 1 << 20), (None, None)):
        old = WriterManifest(step=1, writer=0, writers=1, created=0.0, attempt=attempt,
                             part_size=part_size,
                             files=(FileEntry(path, 3, "00000000", part_size=part_size),))
        assert WriterManifest.from_json(old.to_json()) == old
        assert len(keys.data_key(1, 0, path, attempt)) <= 1024


def test_a_spread_manifest_refuses_a_path_its_longer_keys_cannot_hold() -> None:
    path = _long_path(1024 - len(f"data/{0:020d}/00000/{OLD}/"))
    with pytest.raises(IntegrityError, match="longer than"):
        WriterManifest(step=1, writer=0, writers=1, created=0.0, attempt="s" + OLD,
                       part_size=1 << 20, files=(FileEntry(path, 3, "00000000", 1 << 20),))
    fits = _long_path(1024 - len(f"data/00/{0:020d}/00000/s{OLD}/"))
    m = WriterManifest(step=1, writer=0, writers=1, created=0.0, attempt="s" + OLD,
                       part_size=1 << 20, files=(FileEntry(fits, 3, "00000000", 1 << 20),))
    assert len(keys.data_key(1, 0, fits, m.attempt)) == 1024
