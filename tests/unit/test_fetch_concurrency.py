"""Restore's ranged GETs in flight: two per usable CPU, 4 to 16, unless told;
and the drain's whole-object PUTs carry the CRC32C it took reading the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ckptdrain import checksum, cli, cpus
from ckptdrain.store.local import LocalStore
from ckptdrain.transfer import fetch as fetch_mod
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.scan import build_manifest


@pytest.mark.parametrize(("usable", "streams"), [(1, 4), (2, 4), (3, 6), (8, 16), (96, 16)])
def test_default_concurrency_follows_the_cpus(
        usable: int, streams: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpus, "usable_cpus", lambda: usable)
    assert fetch_mod.default_concurrency() == streams


def _pushed(tmp_path: Path) -> tuple[LocalStore, dict[str, str]]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a" * 300_000)
    (src / "b.bin").write_bytes(b"b" * 1000)
    store = LocalStore(tmp_path / "store")
    manifest = build_manifest(src, 1, 0, 1, created=1.0)
    Drainer(store, part_size=1 << 20).drain(src, manifest, journal_path=tmp_path / "j")
    return store, {e.path: e.crc32c for e in manifest.files}


@pytest.mark.parametrize(("argv", "expected"), [([], None), (["--concurrency", "3"], 3)])
def test_pull_leaves_the_default_to_fetch_unless_told(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str],
        expected: int | None) -> None:
    _pushed(tmp_path)
    monkeypatch.setattr(cpus, "usable_cpus", lambda: 3)
    seen: list[int] = []
    real = fetch_mod._download

    def download(store: Any, mode: str, files: Any, concurrency: int, progress: Any) -> int:
        seen.append(concurrency)
        return real(store, mode, files, concurrency, progress)

    monkeypatch.setattr(fetch_mod, "_download", download)
    code = cli.main(["pull", f"file://{tmp_path / 'store'}", str(tmp_path / "out"), "-q", *argv])
    assert code == 0
    assert seen == [6 if expected is None else expected]
    assert (tmp_path / "out" / "a.bin").read_bytes() == b"a" * 300_000


def test_the_drain_hands_the_store_the_crc32c_it_read(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Bound when the file was read: bytes that change between the read and
    the PUT are refused by the store, not published under the manifest's CRC."""
    given: dict[str, int | None] = {}
    real = LocalStore.put_bytes

    def put_bytes(self: LocalStore, key: str, data: bytes, crc32c: int | None = None) -> None:
        given[key] = crc32c
        real(self, key, data, crc32c)

    monkeypatch.setattr(LocalStore, "put_bytes", put_bytes)
    _, crcs = _pushed(tmp_path)
    data = {k.rsplit("/", 1)[-1]: v for k, v in given.items() if k.endswith(".bin")}
    assert data.keys() == crcs.keys()
    for name, crc in data.items():
        assert crc is not None and checksum.to_hex(crc) == crcs[name]
