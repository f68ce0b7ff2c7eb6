"""The peer wire format and the partner area: what a receiver accepts, refuses,
publishes and keeps. Real files in a temporary local tier; no network."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import pytest

from ckptdrain.errors import IntegrityError, UnsafePath
from ckptdrain.node.localtier import LocalTier
from ckptdrain.peer import protocol, stream
from ckptdrain.peer.area import PartnerArea
from ckptdrain.peer.protocol import PeerRefused, Target


def _captured(tmp_path: Path, step: int, writer: int = 0, writers: int = 2,
              payload: bytes = b"weights") -> LocalTier:
    src = tmp_path / f"src-{writer}-{step}"
    (src / "shard").mkdir(parents=True, exist_ok=True)
    (src / "shard" / "model.pt").write_bytes(payload * 1000)
    (src / "meta.json").write_bytes(b'{"step": %d}' % step)
    tier = LocalTier(tmp_path / f"local-{writer}")
    tier.capture(src, step, writer=writer, writers=writers)
    return tier


def _stream_of(tier: LocalTier, step: int) -> bytes:
    data, manifest = stream.read_copy(tier.step_dir(step))
    return stream.copy_bytes(tier.step_dir(step), manifest, data)


def _push(area: PartnerArea, body: bytes, writer: int, step: int,
          length: int | None = None) -> bool:
    return area.receive(Target(writer, step), io.BytesIO(body),
                        len(body) if length is None else length)


@pytest.mark.parametrize("path", [
    "/v1/copies", "/v1/copies/", "/v1/copies/01", "/v1/copies/0/../1", "/v1/copies/0/1?x=1",
    "/v1/copies/-1", "/v1/copies/0/1/2", "/v1/copies/2", "/etc/passwd",
    "/v1/copies/0/" + "9" * 19,
])
def test_request_targets_other_than_two_numbers_are_refused(path: str) -> None:
    with pytest.raises(PeerRefused) as err:
        protocol.parse_target(path, writers=2)
    assert err.value.status == 404


def test_request_target_names_writer_and_step() -> None:
    assert protocol.parse_target("/v1/copies/1/30", writers=2) == Target(1, 30)
    assert protocol.parse_target("/v1/copies/0", writers=2) == Target(0, None)
    assert protocol.parse_target("/v1/copies/1/30/manifest", writers=2) == Target(
        1, 30, manifest=True)
    assert protocol.parse_target("/v1/copies/1/30/files/7", writers=2) == Target(1, 30, 7)
    assert protocol.parse_target("/v1/copies/1/30", writers=2).whole
    assert not protocol.parse_target("/v1/copies/1/30/files/0", writers=2).whole


@pytest.mark.parametrize("path", [
    "/v1/copies/0/manifest", "/v1/copies/0/1/files", "/v1/copies/0/1/files/",
    "/v1/copies/0/1/files/01",
    "/v1/copies/0/1/files/-1", "/v1/copies/0/1/files/../../x", "/v1/copies/0/1/manifest/",
    "/v1/copies/0/1/files/a.bin", "/v1/copies/0/1/files/1/2", "/v1/copies/0/1/data",
])
def test_part_targets_other_than_an_index_are_refused(path: str) -> None:
    with pytest.raises(PeerRefused) as err:
        protocol.parse_target(path, writers=2)
    assert err.value.status == 404


def test_a_range_is_one_closed_range_clamped_to_the_file() -> None:
    assert protocol.parse_range(None, 100) == (0, 100)
    assert protocol.parse_range("bytes=0-9", 100) == (0, 10)
    assert protocol.parse_range("bytes=90-1000", 100) == (90, 100)
    for bad in ("bytes=100-200", "bytes=5-4", "bytes=0-", "bytes=-5", "bytes=0-1,5-6",
                "items=0-1", "bytes=0 -1", "bytes=١-٢", "bytes=" + "9" * 20 + "-1"):
        with pytest.raises(PeerRefused) as err:
            protocol.parse_range(bad, 100)
        assert err.value.status == 416, bad


def test_a_copy_is_published_verified_and_laid_out_like_a_local_step(tmp_path: Path) -> None:
    tier = _captured(tmp_path, 10)
    area = PartnerArea(tmp_path / "partner", writers=2)
    assert _push(area, _stream_of(tier, 10), 0, 10) is True
    held = area.tier(0)
    assert held.steps() == [10]
    assert held.verify(10).same_content(tier.manifest(10))
    assert (held.data_dir(10) / "shard" / "model.pt").read_bytes() == b"weights" * 1000
    # The same copy again: held, not re-written.
    assert _push(area, _stream_of(tier, 10), 0, 10) is False


def test_a_corrupt_byte_is_never_published(tmp_path: Path) -> None:
    tier = _captured(tmp_path, 10)
    body = bytearray(_stream_of(tier, 10))
    body[-100] ^= 0xFF  # inside the last file's bytes
    area = PartnerArea(tmp_path / "partner", writers=2)
    with pytest.raises(IntegrityError, match="crc32c"):
        _push(area, bytes(body), 0, 10)
    assert area.steps(0) == []
    assert not any(p.name.startswith(".recv-") for p in area.root.iterdir())


def test_a_short_or_long_stream_is_refused_before_writing(tmp_path: Path) -> None:
    tier = _captured(tmp_path, 10)
    body = _stream_of(tier, 10)
    area = PartnerArea(tmp_path / "partner", writers=2)
    with pytest.raises(PeerRefused, match="Content-Length"):
        _push(area, body + b"x", 0, 10)
    with pytest.raises(PeerRefused, match="ended"):
        _push(area, body[:-5], 0, 10, length=len(body))
    assert area.steps(0) == []


def test_the_request_line_and_the_manifest_must_agree(tmp_path: Path) -> None:
    tier = _captured(tmp_path, 10)
    area = PartnerArea(tmp_path / "partner", writers=2)
    with pytest.raises(PeerRefused, match="request names writer 1"):
        _push(area, _stream_of(tier, 10), 1, 10)
    with pytest.raises(PeerRefused, match="request names writer 0 step 11"):
        _push(area, _stream_of(tier, 10), 0, 11)
    other = PartnerArea(tmp_path / "partner3", writers=3)
    with pytest.raises(PeerRefused, match="3"):
        _push(other, _stream_of(tier, 10), 0, 10)


def test_a_manifest_path_escaping_the_area_is_refused(tmp_path: Path) -> None:
    # A hand-made stream whose manifest names '../x': the manifest itself refuses it.
    doc = (b'{"format":1,"step":1,"writer":0,"writers":2,"created":0,"part_size":null,'
           b'"files":[{"path":"../x","size":1,"crc32c":"00000000"}],"extra":{}}')
    body = protocol.header(doc) + doc + b"x"
    area = PartnerArea(tmp_path / "partner", writers=2)
    with pytest.raises(UnsafePath):
        _push(area, body, 0, 1)
    assert not (tmp_path / "partner" / "x").exists()


def test_an_oversized_manifest_length_is_refused_unread(tmp_path: Path) -> None:
    body = protocol.HEADER.pack(protocol.MAX_MANIFEST_BYTES + 1)
    with pytest.raises(PeerRefused) as err:
        _push(PartnerArea(tmp_path, writers=2), body, 0, 1, length=1 << 40)
    assert err.value.status == 413


def test_a_copy_over_the_capacity_is_refused(tmp_path: Path) -> None:
    tier = _captured(tmp_path, 10)
    area = PartnerArea(tmp_path / "partner", writers=2, capacity=1000)
    with pytest.raises(PeerRefused) as err:
        _push(area, _stream_of(tier, 10), 0, 10)
    assert err.value.status == 507
    assert area.steps(0) == []


def test_retention_keeps_the_newest_copies_per_writer(tmp_path: Path) -> None:
    area = PartnerArea(tmp_path / "partner", writers=2, keep=2)
    for step in (10, 20, 30):
        _push(area, _stream_of(_captured(tmp_path, step), step), 0, step)
    _push(area, _stream_of(_captured(tmp_path, 5, writer=1), 5), 1, 5)
    assert area.steps(0) == [30, 20]
    assert area.steps(1) == [5]
    with pytest.raises(PeerRefused, match="older than"):
        _push(area, _stream_of(_captured(tmp_path, 15), 15), 0, 15)


def test_retention_makes_room_within_the_capacity(tmp_path: Path) -> None:
    one = _captured(tmp_path, 10).manifest(10).total_bytes
    area = PartnerArea(tmp_path / "partner", writers=2, keep=1, capacity=one + 100)
    for step in (10, 20):
        _push(area, _stream_of(_captured(tmp_path, step), step), 0, step)
    assert area.steps(0) == [20]


def test_a_bad_replacement_leaves_the_held_copy_in_place(tmp_path: Path) -> None:
    # A push of other bytes under a held step replaces the copy only once every
    # byte of the new one is verified: a torn or corrupt push must not cost the
    # copy a restore may still need.
    area = PartnerArea(tmp_path / "partner", writers=2)
    held = _captured(tmp_path, 10)
    _push(area, _stream_of(held, 10), 0, 10)
    other = bytearray(_stream_of(_captured(tmp_path / "b", 10, payload=b"other"), 10))
    other[-100] ^= 0xFF
    with pytest.raises(IntegrityError, match="crc32c"):
        _push(area, bytes(other), 0, 10)
    assert area.steps(0) == [10]
    assert area.tier(0).verify(10).same_content(held.manifest(10))
    # A good replacement still wins.
    newer = _captured(tmp_path / "c", 10, payload=b"newer")
    assert _push(area, _stream_of(newer, 10), 0, 10) is True
    assert area.tier(0).verify(10).same_content(newer.manifest(10))
    assert area.steps(0) == [10]


def test_a_copy_that_fits_only_after_retention_is_written_after_it(tmp_path: Path) -> None:
    # The disk check counts what retention frees ("free space after retention"),
    # so what it frees must be gone before the bytes arrive: else a copy that
    # passed the check runs the disk (shared with this node's own writer) full
    # and fails half-way with ENOSPC.
    from tests.support.smallfs import small_filesystem
    with small_filesystem(tmp_path / "nvme", "5m") as nvme:
        area = PartnerArea(nvme, writers=2, keep=1)
        first = _captured(tmp_path, 10, payload=bytes(range(250)) * 12)  # 3 MB
        second = _captured(tmp_path / "b", 20, payload=bytes(range(250)) * 12)
        assert _push(area, _stream_of(first, 10), 0, 10) is True
        assert _push(area, _stream_of(second, 20), 0, 20) is True
        assert area.steps(0) == [20]
        assert area.tier(0).verify(20).same_content(second.manifest(20))


@pytest.mark.parametrize("sizes,streams,min_span", [
    ([100], 4, 10), ([100], 1, 10), ([5], 4, 10), ([0, 7, 0, 93, 0], 4, 10),
    ([40, 40, 40], 2, 10), ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3, 1), ([0, 0], 4, 10), ([], 4, 10),
    ([10 ** 12, 3], 4, 1 << 24),
])
def test_spans_cover_every_byte_once_in_order(sizes: list[int], streams: int,
                                              min_span: int) -> None:
    from ckptdrain.peer.parts import plan
    spans = plan(sizes, streams, min_span)
    total = sum(sizes)
    assert len(spans) <= max(1, min(streams, total // min_span))
    pieces = [p for span in spans for p in span]
    assert all(p.start < p.end <= sizes[p.index] for p in pieces)
    flat = [(p.index, p.start, p.end) for p in pieces]
    assert flat == sorted(flat)  # spans are contiguous and in manifest order
    for index, size in enumerate(sizes):
        mine = [(s, e) for i, s, e in flat if i == index]
        assert sum(e - s for s, e in mine) == size
        assert all(a[1] == b[0] for a, b in itertools.pairwise(mine))
    if total >= streams * min_span:
        lengths = [sum(p.end - p.start for p in span) for span in spans]
        assert len(spans) == streams and max(lengths) - min(lengths) <= 1
