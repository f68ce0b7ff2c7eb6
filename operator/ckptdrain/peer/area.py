"""The partner area: the copies this agent holds for its partners' writers.

    <local>/peer/w<writer>/step-<N>/data/<path>      laid out like a local step
    <local>/peer/w<writer>/step-<N>/manifest.json    written last (peer/stream.py)
    <local>/peer/.recv-w<writer>-s<N>-<id>/          a copy being received (never read;
                                                     removed at start-up)

Every location is derived here from two numbers; nothing the network sends
names a directory. Each writer's copies are a LocalTier of their own, so
listing, reading and verifying a held copy is the local tier's code. The
agent's own writer's local tier (`<local>/step-<N>`) is served read-only
beside them (`served_steps`, `source`), never written through here.
"""

from __future__ import annotations

import itertools
import logging
import re
import shutil
import threading
from pathlib import Path
from typing import BinaryIO

from ckptdrain.node import space
from ckptdrain.node.localtier import LocalTier
from ckptdrain.peer import protocol, stream
from ckptdrain.peer.protocol import PeerRefused, Target

log = logging.getLogger(__name__)

_TEMP_PREFIX = ".recv-"
DIRNAME = "peer"
_WRITER_DIR = re.compile(r"w(0|[1-9][0-9]*)")
_ids = itertools.count()


class PartnerArea:
    """Copies held for other writers of one policy, under `<local>/peer`."""

    def __init__(self, local_dir: Path, *, writers: int, keep: int = 2,
                 capacity: int | None = None, own_writer: int | None = None) -> None:
        if keep < 1:
            raise ValueError(f"keep: expected at least 1, got {keep}")
        self.root = Path(local_dir) / DIRNAME
        self.writers = writers
        self.keep = keep
        self.capacity = capacity
        #: This agent's own writer: its local tier (`local_dir`) is served read-only
        #: too, so a restore elsewhere can learn and fetch what only this node holds.
        self.own = (own_writer, LocalTier(local_dir)) if own_writer is not None else None
        # One copy of a (writer, step) at a time; different writers in parallel.
        self._lock = threading.Lock()
        self._busy: set[tuple[int, int]] = set()

    def tier(self, writer: int) -> LocalTier:
        if not 0 <= writer < self.writers:
            raise PeerRefused(404, f"writer {writer} outside 0..{self.writers - 1}")
        return LocalTier(self.root / f"w{writer}")

    def steps(self, writer: int) -> list[int]:
        """Held steps of `writer`, newest first."""
        return self.tier(writer).steps()

    def served_steps(self, writer: int) -> list[int]:
        """Steps of `writer` this agent can serve: copies held for it, and its own
        local steps when `writer` is this agent's own. Newest first."""
        own = self.own[1].steps() if self.own is not None and self.own[0] == writer else []
        return sorted(set(self.steps(writer)) | set(own), reverse=True)

    def source(self, writer: int, step: int) -> LocalTier | None:
        """The tier holding `writer`'s `step` here (a held copy first), or None."""
        held = self.tier(writer)
        if held.has(step):
            return held
        if self.own is not None and self.own[0] == writer and self.own[1].has(step):
            return self.own[1]
        return None

    def used_bytes(self) -> int:
        """Data bytes of every held copy (by their manifests, as capacity counts them)."""
        if not self.root.is_dir():
            return 0
        held = [LocalTier(d) for d in self.root.iterdir() if _WRITER_DIR.fullmatch(d.name)]
        return sum(t.bytes_of(s) for t in held for s in t.steps())

    def remove_temps(self) -> None:
        if self.root.is_dir():
            for entry in self.root.iterdir():
                if entry.name.startswith(_TEMP_PREFIX):
                    shutil.rmtree(entry, ignore_errors=True)

    def receive(self, target: Target, body: BinaryIO, content_length: int) -> bool:
        """Receive a pushed copy; True when published, False when already held.

        The stream is read to its end in every non-error case, so the
        connection stays usable. Raises PeerRefused / IntegrityError (nothing
        published) on anything off."""
        assert target.step is not None
        manifest, json_len = stream.read_manifest(body)
        protocol.check_copy(manifest, target, self.writers, content_length, json_len)
        tier = self.tier(target.writer)
        key = (target.writer, target.step)
        with self._lock:
            if key in self._busy:
                raise PeerRefused(409, f"writer {target.writer} step {target.step} "
                                       "is already being received")
            self._busy.add(key)
        try:
            replacing = False
            if tier.has(target.step):
                held = tier.manifest(target.step)
                if held.same_content(manifest):
                    _discard(body, manifest.total_bytes)
                    return False
                # Another pod with this rank wrote other bytes under this step
                # (a restart from an older step): the newer push wins, but only
                # once it is verified (the held copy goes just before publishing).
                log.warning("replacing held copy of writer %d step %d: content differs",
                            target.writer, target.step)
                replacing = True
            kept = sorted({*tier.steps(), target.step}, reverse=True)
            if target.step in kept[self.keep:]:
                raise PeerRefused(409, f"step {target.step} is older than the {self.keep} "
                                       f"copies held for writer {target.writer}")
            # Evicted copies (and a replaced one) go once the new copy is in ...
            doomed = kept[self.keep:]
            replaced = tier.bytes_of(target.step) if replacing else 0
            evicted = sum(tier.bytes_of(s) for s in doomed) + replaced
            self.root.mkdir(parents=True, exist_ok=True)
            need = manifest.total_bytes
            protocol.check_room(need, self.used_bytes() - evicted,
                                self.capacity, space.free_bytes(self.root) + evicted)
            # ... unless the disk holds the copy only once they are gone: then
            # they go first (the disk is shared with this node's own writer, and
            # a copy that runs it full fails half-way anyway). The copy being
            # replaced goes last, and only when nothing else makes room.
            if need > space.free_bytes(self.root):
                for step in doomed:
                    tier.remove(step)
                if replacing and need > space.free_bytes(self.root):
                    tier.remove(target.step)
                    replacing = False
            tmp = self.root / f"{_TEMP_PREFIX}w{target.writer}-s{target.step}-{next(_ids)}"
            data = manifest.to_json()
            stream.write_copy(body, manifest, data, tmp, tier.step_dir(target.step),
                              before_publish=(lambda: tier.remove(target.step))
                              if replacing else None)
            for step in tier.steps()[self.keep:]:
                tier.remove(step)
            return True
        finally:
            with self._lock:
                self._busy.discard(key)


def _discard(body: BinaryIO, n: int) -> None:
    while n:
        chunk = body.read(min(n, stream.CHUNK))
        if not chunk:
            return
        n -= len(chunk)
