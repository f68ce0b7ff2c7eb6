"""Copy streams to and from a step directory laid out like the local tier's
(`step-<N>/data/<path>` and `step-<N>/manifest.json`, node/localtier.py).

`write_copy` is the one receiving path, used by the partner area (a copy
pushed by a writer) and by restore (a copy fetched back): every file is
written under a new temporary directory while its CRC32C is computed, and
must match the manifest before the next one starts; then files and
directories are fsync'd, the manifest is written last and the directory is
renamed into place. Any failure removes the temporary directory, so a
partial or corrupt copy is never published.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ckptdrain import checksum, paths
from ckptdrain.errors import IntegrityError
from ckptdrain.localfs import fsync_dir
from ckptdrain.manifest import FileEntry, WriterManifest
from ckptdrain.node import durable
from ckptdrain.node.localtier import DATA, MANIFEST
from ckptdrain.peer import protocol
from ckptdrain.peer.protocol import PeerRefused

CHUNK = 4 << 20
StopCheck = Callable[[], bool]


def read_exact(stream: BinaryIO, n: int) -> bytes:
    """Exactly `n` bytes (small reads only: the header and the manifest)."""
    parts, left = [], n
    while left:
        chunk = stream.read(min(left, CHUNK))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def read_manifest(stream: BinaryIO) -> tuple[WriterManifest, int]:
    """(manifest, its JSON length) from the head of a copy stream."""
    length = protocol.manifest_length(read_exact(stream, protocol.HEADER.size))
    data = read_exact(stream, length)
    if len(data) != length:
        raise PeerRefused(400, "copy stream ended inside its manifest")
    return WriterManifest.from_json(data), length


def _write_file(stream: BinaryIO, target: Path, size: int, buffer: memoryview,
                should_stop: StopCheck | None) -> int:
    crc, left = 0, size
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        while left:
            if should_stop is not None and should_stop():
                raise durable.CopyAborted("copy stopped")
            n = stream.readinto(buffer[:min(left, len(buffer))])
            if not n:
                raise PeerRefused(400, f"copy stream ended {left} bytes early in {target.name}")
            view = buffer[:n]
            crc = checksum.crc32c(view, crc)
            while view:
                view = view[os.write(fd, view):]
            left -= n
        os.fsync(fd)
    finally:
        os.close(fd)
    return crc


def write_copy(stream: BinaryIO, manifest: WriterManifest, manifest_json: bytes,
               tmp: Path, final: Path, *, should_stop: StopCheck | None = None,
               before_publish: Callable[[], None] | None = None) -> None:
    """Write the files of `manifest` from `stream` into `tmp`, verify each against
    the manifest's CRC32C, then publish `tmp` as `final` (manifest last, rename).
    `before_publish` runs once every byte is verified, just before the rename
    (a copy being replaced goes only then, never for a copy that fails).

    Raises IntegrityError (a file whose bytes do not match) or PeerRefused (a
    short stream); `tmp` is gone afterwards either way."""
    shutil.rmtree(tmp, ignore_errors=True)
    data = tmp / DATA
    data.mkdir(parents=True)
    buffer = memoryview(bytearray(CHUNK))  # one per copy: no allocation per chunk
    try:
        targets = []
        for entry in manifest.files:  # sorted by path: the sender's order
            target = paths.resolve_under(data, entry.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            targets.append(target)
            crc = _write_file(stream, target, entry.size, buffer, should_stop)
            if checksum.to_hex(crc) != entry.crc32c:
                raise PeerRefused(422, f"{entry.path}: received crc32c {checksum.to_hex(crc)}, "
                                       f"manifest says {entry.crc32c}")
        publish_copy(tmp, data_dirs(data, targets), manifest_json, final, before_publish)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish_copy(tmp: Path, dirs: set[Path], manifest_json: bytes, final: Path,
                 before_publish: Callable[[], None] | None = None) -> None:
    """Publish `tmp`, whose files are written, fsync'd and verified, as `final`:
    its directories fsync'd, the manifest written last, then the rename."""
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(d)
    durable.write_bytes(tmp / MANIFEST, manifest_json, exclusive=True)
    fsync_dir(tmp)
    final.parent.mkdir(parents=True, exist_ok=True)
    if before_publish is not None:
        before_publish()
    durable.publish(tmp, final)


def data_dirs(data: Path, targets: list[Path]) -> set[Path]:
    """Every directory from `data` down to the files' parents (to fsync)."""
    dirs = {data.parent, data}
    for target in targets:
        dirs.update(p for p in target.parents if p.is_relative_to(data))
    return dirs


def read_copy(step_dir: Path) -> tuple[bytes, WriterManifest]:
    """(manifest JSON, manifest) of a published step directory."""
    data = (step_dir / MANIFEST).read_bytes()
    return data, WriterManifest.from_json(data)


def send_copy(step_dir: Path, manifest: WriterManifest, manifest_json: bytes,
              send: Callable[[memoryview], object]) -> None:
    """Hand the copy stream of a published step to `send`, in chunks of at
    most CHUNK bytes. Every file chunk is a view of one buffer reused for the
    next (a fresh 4 MiB allocation per chunk cost more CPU than the socket):
    `send` must be done with it when it returns.

    The sender does not re-verify (the receiver does, against the same
    manifest); a file that changed size under it ends the stream with an
    IntegrityError rather than sending a stream of the wrong length."""
    send(memoryview(protocol.header(manifest_json)))
    send(memoryview(manifest_json))
    buffer = memoryview(bytearray(CHUNK))
    for entry in manifest.files:
        send_range(step_dir, entry, 0, entry.size, send, buffer)


def send_range(step_dir: Path, entry: FileEntry, start: int, end: int,
               send: Callable[[memoryview], object], buffer: memoryview | None = None) -> None:
    """Bytes [start, end) of one file of a published step, to `send` (views of
    one reused buffer, as in send_copy)."""
    path = paths.resolve_under(step_dir / DATA, entry.path)
    buffer = buffer if buffer is not None else memoryview(bytearray(min(CHUNK, end - start)))
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        left = end - start
        while left:
            n = f.readinto(buffer[:min(left, len(buffer))])
            if not n:
                raise IntegrityError(f"{path}: shorter than the manifest's {entry.size} bytes")
            left -= n
            send(buffer[:n])


def copy_bytes(step_dir: Path, manifest: WriterManifest, manifest_json: bytes) -> bytes:
    """The whole copy stream in memory (small copies: tests and tools)."""
    parts: list[bytes] = []
    send_copy(step_dir, manifest, manifest_json, lambda chunk: parts.append(bytes(chunk)))
    return b"".join(parts)
