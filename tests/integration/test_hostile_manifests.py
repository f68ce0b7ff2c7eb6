"""Hostile manifests in real stores (file://, SeaweedFS, MinIO): each is an
integrity problem of its own step. `ls` shows the step incomplete on one
line, `pull` and the restore init step take the next newest step, and
nothing crashes, runs out of memory or writes outside the destination."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.agentprocs import Pod

from ckptdrain import checksum, keys
from ckptdrain.errors import IntegrityError
from ckptdrain.manifest import MAX_FILE_BYTES, MAX_PART_BYTES
from ckptdrain.store.base import Store
from ckptdrain.store.gcs import GcsStore
from ckptdrain.store.local import LocalStore
from ckptdrain.store.s3 import S3Store
from ckptdrain.transfer.catalog import scan
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.fetch import MIN_RANGE, fetch
from ckptdrain.transfer.scan import build_manifest

pytestmark = pytest.mark.integration
ATTEMPT = "0123456789abcdef"


def _doc(**change: object) -> bytes:
    base: dict[str, object] = {
        "format": 2, "step": 9, "writer": 0, "writers": 1, "created": 1.0, "attempt": ATTEMPT,
        "part_size": 1 << 20, "extra": {},
        "files": [{"path": "a.bin", "size": 4, "crc32c": "00000000", "part_size": 1 << 20}]}
    base.update(change)
    return json.dumps(base).encode()


def _file(**change: object) -> bytes:
    entry: dict[str, object] = {"path": "a.bin", "size": 4, "crc32c": "00000000",
                                "part_size": 1 << 20}
    entry.update(change)
    return _doc(files=[entry])


HOSTILE: dict[str, bytes] = {
    "nested array": b"[" * 200_000 + b"]" * 200_000,
    "nested in files": _doc()[:-1] + b',"x":' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}",
    "lone surrogate in a path": _file(path="a\ud800b.bin"),
    "lone surrogate in extra": _doc(extra={"k": "\udfff"}),
    "size 2^70": _file(size=2**70),
    "size 1 PB": _file(size=10**15),
    "300-byte name": _file(path="d/" + "n" * 300),
    "negative part size": _file(part_size=-1),
    "huge part size": _file(part_size=2**70),
    "tiny parts of a huge file": _file(size=2**40, part_size=1),
    "writers 10^30": _doc(writers=10**30),
    "writers as text": _doc(writers="1"),
    "step as a list": _doc(step=[9]),
    "files as text": _doc(files="a.bin"),
    "crc as a number": _file(crc32c=12345678),
    "created null": _doc(created=None),
    "extra a list": _doc(extra=[]),
    "attempt escapes": _doc(attempt="../../../etc"),
    "attempt a number": _doc(attempt=123),
    "format 1 with an attempt": _doc(format=1),
    "int with 5000 digits": _doc()[:-1] + b',"y":' + b"9" * 5000 + b"}",
    "newline in a name": _file(path="line\nbreak.bin"),
    "not utf-8": b'{"format": 2, "step": 9, "\xff\xfe": 1}',
}


def _good(store: Store, tmp: Path, step: int) -> Path:
    src = tmp / f"good-{step}"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(3 << 20))
    manifest = build_manifest(src, step, 0, 1, created=time.time())
    Drainer(store, part_size=5 << 20).drain(src, manifest, journal_path=tmp / f"j{step}")
    return src


@pytest.fixture
def seeded(store: Store, tmp_path: Path) -> Iterator[tuple[Store, Path]]:
    """Step 8 good; step 9's manifest is set by each test."""
    yield store, _good(store, tmp_path, 8)


def _cli(store: Store, request: pytest.FixtureRequest, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if isinstance(store, S3Store):
        server = request.getfixturevalue("store_server")
        env.update(CKPTDRAIN_S3_ENDPOINT=server.endpoint_url, AWS_ACCESS_KEY_ID=server.access_key,
                   AWS_SECRET_ACCESS_KEY=server.secret_key, AWS_DEFAULT_REGION=server.region)
    if isinstance(store, GcsStore):  # an emulator: plain http, asked anonymously
        env["STORAGE_EMULATOR_HOST"] = store.endpoint.split("://", 1)[1]
    return subprocess.run([sys.executable, "-m", "ckptdrain", *args], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_newest_manifest_is_skipped_by_pull(
        seeded: tuple[Store, Path], tmp_path: Path, name: str) -> None:
    store, good = seeded
    store.put_bytes(keys.manifest_key(9, 0), HOSTILE[name])
    catalog = scan(store)
    assert [c.step for c in catalog.complete] == [8]
    assert [r.step for r in catalog.rejected] == [9]
    assert catalog.rejected[0].reason.isprintable()
    (tmp_path / "in").mkdir()
    got = fetch(store, tmp_path / "in" / "dest")
    assert got.step == 8 and got.skipped and got.skipped[0].startswith("step 9")
    assert (tmp_path / "in" / "dest" / "a.bin").read_bytes() == (good / "a.bin").read_bytes()
    assert [p.name for p in (tmp_path / "in").iterdir()] == ["dest"]


def test_ls_and_pull_say_one_line_and_take_the_next_step(
        seeded: tuple[Store, Path], tmp_path: Path, request: pytest.FixtureRequest) -> None:
    store, good = seeded
    for step, name in enumerate(["nested array", "lone surrogate in a path", "size 2^70",
                                 "newline in a name", "300-byte name"], start=9):
        store.put_bytes(keys.manifest_key(step, 0),
                        HOSTILE[name].replace(b'"step": 9', f'"step": {step}'.encode()))
    ls = _cli(store, request, "ls", store.uri)
    assert ls.returncode == 0 and "Traceback" not in ls.stderr, ls.stderr
    lines = ls.stdout.splitlines()[1:]
    assert len(lines) == 6 and [int(line.split()[0]) for line in lines] == [13, 12, 11, 10, 9, 8]
    assert all("incomplete" in line for line in lines[:5]) and lines[5].endswith("complete")
    pull = _cli(store, request, "pull", store.uri, str(tmp_path / "dest"))
    assert pull.returncode == 0 and "Traceback" not in pull.stderr, pull.stderr
    assert len(pull.stderr.splitlines()) == 5  # one "skipped" line per hostile step
    assert (tmp_path / "dest" / "a.bin").read_bytes() == (good / "a.bin").read_bytes()


def test_tiny_part_sizes_are_read_in_ranges_of_at_least_the_floor(tmp_path: Path) -> None:
    """A manifest may claim 512-byte parts: reads still come in >= 1 MiB ranges."""
    store = LocalStore(tmp_path / "s")
    data = os.urandom(4 << 20)
    store.put_bytes(keys.data_key(3, 0, "a.bin", ATTEMPT), data)
    doc = _file(size=len(data), part_size=512, crc32c=checksum.to_hex(checksum.crc32c(data)))
    store.put_bytes(keys.manifest_key(3, 0), doc.replace(b'"step": 9', b'"step": 3'))
    reads: list[int] = []

    class Counting(LocalStore):
        def get_range(self, key: str, start: int, length: int) -> bytes:
            reads.append(length)
            return super().get_range(key, start, length)

        def get_range_into(self, key: str, start: int, buffer: memoryview) -> int:
            reads.append(len(buffer))
            return super().get_range_into(key, start, buffer)

    fetch(Counting(tmp_path / "s"), tmp_path / "dest", step=3)
    assert (tmp_path / "dest" / "a.bin").read_bytes() == data
    assert len(reads) == 4 and min(reads) >= MIN_RANGE


def test_a_huge_size_allocates_nothing_before_the_first_read(tmp_path: Path) -> None:
    """The largest object a store can hold, claimed by a manifest whose data
    is four bytes: a valid manifest that lies. Fetching it costs no memory
    to speak of, and the step before it is restored."""
    store = LocalStore(tmp_path / "s")
    good = _good(store, tmp_path, 8)
    store.put_bytes(keys.data_key(9, 0, "a.bin", ATTEMPT), b"tiny")
    store.put_bytes(keys.manifest_key(9, 0), _file(size=MAX_FILE_BYTES, part_size=MAX_PART_BYTES))
    tracemalloc.start()
    try:
        with pytest.raises(IntegrityError):
            fetch(store, tmp_path / "dest9", step=9)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20
    assert not (tmp_path / "dest9").exists()
    got = fetch(store, tmp_path / "dest")
    assert got.step == 8 and got.skipped[0].startswith("step 9")
    assert (tmp_path / "dest" / "a.bin").read_bytes() == (good / "a.bin").read_bytes()


def test_restore_init_step_takes_the_next_step(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    good = _good(store, tmp_path, 8)
    for step, name in enumerate(["nested array", "size 2^70", "lone surrogate in a path"], 9):
        store.put_bytes(keys.manifest_key(step, 0),
                        HOSTILE[name].replace(b'"step": 9', f'"step": {step}'.encode()))
    pod = Pod(tmp_path / "pod", store_env={"CKPTDRAIN_STORE_URI": store.uri})
    code, result = pod.restore()
    assert code == 0, result
    assert (result["step"], result["tier"]) == (8, "global"), result
    assert "Traceback" not in result["_stderr"]
    restored = next(p for p in (tmp_path / "pod" / "work").rglob("a.bin"))
    assert restored.read_bytes() == (good / "a.bin").read_bytes()
