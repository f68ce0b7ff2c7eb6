"""The peer wire protocol, pure: request targets, the copy stream's framing, bounds.

A copy stream is one writer's step (docs/peer-tier.md):

    8 bytes   manifest length M, big-endian
    M bytes   the writer manifest (manifest.WriterManifest JSON)
    ...       each file's bytes, in the manifest's path order, `size` bytes each

Two more resources serve a restore that reads a copy over several
connections at once (one TLS stream is bound by one core):

    GET /v1/copies/<writer>/<step>/manifest   the writer manifest (JSON)
    GET /v1/copies/<writer>/<step>/files/<i>  file i of the manifest's list;
                                              `Range: bytes=a-b` for a part

Nothing from the request line but decimal numbers ever reaches the
filesystem: `parse_target` returns (writer, step, file) or refuses; a file
is named by its index in the manifest the server holds, never by a path.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from ckptdrain.errors import IntegrityError
from ckptdrain.manifest import MAX_WRITERS, WriterManifest, check_step

API_PREFIX = "/v1/copies"
#: The agent's peer port (metrics stay on 9108).
DEFAULT_PORT = 9109
#: A manifest of a million files is ~100 MiB; a writer's share of one step never
#: comes near that, and the receiver holds the manifest in memory.
MAX_MANIFEST_BYTES = 64 << 20
HEADER = struct.Struct(">Q")
_NUMBER = r"(0|[1-9][0-9]{0,17})"
_TARGET = re.compile(rf"{API_PREFIX}/{_NUMBER}(?:/{_NUMBER}(/manifest|/files/{_NUMBER})?)?")
_RANGE = re.compile(r"bytes=([0-9]{1,19})-([0-9]{1,19})")


class PeerRefused(IntegrityError):
    """A peer request refused, with the HTTP status to answer and one line saying why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Target:
    writer: int
    step: int | None
    #: An index into the step's manifest files (`/files/<i>`).
    file: int | None = None
    #: `/manifest`: the manifest alone.
    manifest: bool = False

    @property
    def whole(self) -> bool:
        """The whole copy stream of a step (the only thing PUT takes)."""
        return self.step is not None and self.file is None and not self.manifest


def parse_target(path: str, writers: int) -> Target:
    """The target of a request path `/v1/copies/<writer>[/<step>[/manifest |
    /files/<i>]]`.

    Refuses (404) anything else, query strings included, and a writer
    outside 0..writers-1 (a policy has exactly `writers` ranks)."""
    match = _TARGET.fullmatch(path)
    if not match:
        raise PeerRefused(404, f"no such resource: {path[:80]!r} (expected {API_PREFIX}"
                               "/<writer>[/<step>[/manifest|/files/<index>]])")
    writer = int(match[1])
    if not 0 <= writer < min(writers, MAX_WRITERS):
        raise PeerRefused(404, f"writer {writer} outside 0..{writers - 1}")
    step = None if match[2] is None else check_step(int(match[2]))
    file = None if match[4] is None else int(match[4])
    return Target(writer, step, file, match[3] == "/manifest")


def target_path(writer: int, step: int | None = None) -> str:
    return f"{API_PREFIX}/{writer}" + ("" if step is None else f"/{step}")


def manifest_path(writer: int, step: int) -> str:
    return f"{target_path(writer, step)}/manifest"


def file_path(writer: int, step: int, index: int) -> str:
    return f"{target_path(writer, step)}/files/{index}"


def parse_range(value: str | None, size: int) -> tuple[int, int]:
    """[start, end) of a file of `size` bytes from a `Range` header: none is
    the whole file; `bytes=a-b` (one range, both ends given) is clamped to the
    file as HTTP does. Anything else, or a start past the end, is refused (416)."""
    if value is None:
        return 0, size
    match = _RANGE.fullmatch(value.strip())
    if not match or int(match[1]) > int(match[2]):
        raise PeerRefused(416, f"Range must be bytes=<first>-<last>, got {value!r:.60}")
    start, last = int(match[1]), int(match[2])
    if start >= size:
        raise PeerRefused(416, f"range starts at {start}, the file has {size} bytes")
    return start, min(last + 1, size)


def header(manifest_json: bytes) -> bytes:
    return HEADER.pack(len(manifest_json))


def manifest_length(head: bytes) -> int:
    """M from the 8-byte header; refuses (413) a manifest over MAX_MANIFEST_BYTES."""
    if len(head) != HEADER.size:
        raise PeerRefused(400, "copy stream ended inside its header")
    (length,) = HEADER.unpack(head)
    if not 0 < length <= MAX_MANIFEST_BYTES:
        raise PeerRefused(413, f"manifest length {length} outside 1..{MAX_MANIFEST_BYTES}")
    return length


def content_length(value: str | None) -> int | None:
    """A Content-Length as a number, or None unless it is a plain ASCII decimal
    of at most 19 digits (str.isdigit() also takes '²' and other digits int()
    refuses, and int() refuses thousands of digits)."""
    if value is None or not (value.isascii() and value.isdigit()) or len(value) > 19:
        return None
    return int(value)


def stream_length(manifest: WriterManifest, manifest_json_len: int) -> int:
    """The exact length of the copy stream of `manifest`."""
    return HEADER.size + manifest_json_len + manifest.total_bytes


def check_copy(manifest: WriterManifest, target: Target, writers: int,
               content_length: int, manifest_json_len: int) -> None:
    """The manifest must be the one the request line names, of this policy's
    writer count, and the body exactly as long as it says (else PeerRefused)."""
    if (manifest.writer, manifest.step) != (target.writer, target.step):
        raise PeerRefused(400, f"manifest is writer {manifest.writer} step {manifest.step}, "
                               f"request names writer {target.writer} step {target.step}")
    if manifest.writers != writers:
        raise PeerRefused(409, f"manifest has {manifest.writers} writers, this policy has "
                               f"{writers}")
    want = stream_length(manifest, manifest_json_len)
    if content_length != want:
        raise PeerRefused(400, f"Content-Length {content_length}, the manifest makes "
                               f"{want} bytes")


def check_room(need: int, used: int, capacity: int | None, free: int) -> None:
    """Refuse (507) a copy of `need` bytes that the partner area cannot hold:
    over its capacity (after what it keeps anyway) or over the disk's free space."""
    if capacity is not None and used + need > capacity:
        raise PeerRefused(507, f"copy of {need} bytes does not fit the partner area: "
                               f"{used} of {capacity} bytes held")
    if need > free:
        raise PeerRefused(507, f"copy of {need} bytes does not fit the disk: {free} bytes free")
