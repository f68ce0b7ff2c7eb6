"""The peer tier as a DCP reader's source: a committed step's files from a
partner agent that holds a copy of their writer's step (docs/peer-tier.md).

    sources = tier_sources(store, local={writer: local_dir}, cache_dir="/nvme")
    # [LocalSource, PeerSource, GlobalSource] when the container has the peer
    # tier's environment, else [LocalSource, GlobalSource]

On the first file of a writer, the writer's copy of the step is fetched once,
whole (the peer protocol serves whole copies), from the peer servers that may
hold it (its holder, its previous holder, its own node's: the same order
restore asks in), into a private directory under `cache_dir`. The fetch
refuses a copy whose manifest is not the committed one's content (step,
writer, writers, and every file's path, size and CRC32C) before reading its
data, and checks each file's CRC32C as it arrives (peer/client.py); nothing is
published otherwise. Files are then served from that copy as LocalSource
serves the local tier: size and CRC32C checked again, linked into the target.

Anything else declines (None), and the next tier (the store) is asked: no
peers document or no server for the writer, a server that cannot be reached,
does not hold the step, answers garbage or fails mutual TLS, a copy that
differs from the committed manifest or fails its CRC32Cs, no room under
`cache_dir`. A writer whose copy was declined is not asked again by this
source. Every request is bounded: asking which steps a server holds waits
`ask_timeout` (a lost node never answers), each read of the fetch
`fetch_timeout`.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

from ckptdrain.contract.env import Env
from ckptdrain.contract.peers import PeerView
from ckptdrain.dcp.sources import GlobalSource, LocalSource, Provided, Source, Want
from ckptdrain.errors import CkptdrainError
from ckptdrain.node import space
from ckptdrain.node.localtier import LocalTier
from ckptdrain.peer import config as peer_config
from ckptdrain.peer.client import PeerClient
from ckptdrain.peer.tls import PeerCredentials
from ckptdrain.restore.peer_source import ASK_TIMEOUT, FETCH_TIMEOUT, servers_for
from ckptdrain.store.base import Store

log = logging.getLogger(__name__)


class PeerSource:
    """Files of committed steps from the peer servers that hold their writers' copies."""

    name = "peer"

    def __init__(self, credentials: PeerCredentials, view: PeerView, *,
                 cache_dir: str | Path | None = None, ask_timeout: float = ASK_TIMEOUT,
                 fetch_timeout: float = FETCH_TIMEOUT) -> None:
        self.credentials = credentials
        self.view = view
        self.cache_dir = cache_dir
        self.ask_timeout = ask_timeout
        self.fetch_timeout = fetch_timeout
        #: (writer, step) -> the fetched copy's tier root, or None: declined.
        self.copies: dict[tuple[int, int], Path | None] = {}
        #: (writer, step) -> why each server was not used (for logs and tests).
        self.problems: dict[tuple[int, int], list[str]] = {}
        self._root: Path | None = None
        self._guard = threading.Lock()
        self._locks: dict[tuple[int, int], threading.Lock] = {}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 cache_dir: str | Path | None = None) -> PeerSource | None:
        """The peer source of this container's peer-tier environment
        (CKPTDRAIN_POLICY, CKPTDRAIN_PEER_CREDENTIALS, CKPTDRAIN_PEERS_FILE;
        peer/config.py), or None when the tier is off, its peers document is not
        readable, or its credentials are not usable (logged: the store still serves)."""
        env = os.environ if environ is None else environ
        try:
            pcfg = peer_config.load(env.get(Env.POLICY, "").strip(), env)
            if pcfg is None:
                return None
            pcfg.credentials.client_context()  # the mounted files load, now
        except (CkptdrainError, OSError) as err:
            log.warning("peer tier not used for reading: %s", err)
            return None
        view = pcfg.view()
        if view is None:
            log.warning("peer tier not used for reading: no readable peers document at %s",
                        pcfg.peers_file)
            return None
        return cls(pcfg.credentials, view, cache_dir=cache_dir)

    def provide(self, want: Want) -> Provided | None:
        key = (want.manifest.writer, want.step)
        with self._guard:  # files are served in parallel: one fetch per writer
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self.copies:
                self.copies[key] = self._fetch(want)
            root = self.copies[key]
        if root is None:
            return None
        return LocalSource({want.manifest.writer: root}).provide(want)

    def _fetch(self, want: Want) -> Path | None:
        """Fetch `want`'s writer's copy of the step, verified; its tier root, or None."""
        m = want.manifest
        key = (m.writer, want.step)
        problems = self.problems.setdefault(key, [])
        addresses = servers_for(self.view, m.writer)
        if not addresses:
            problems.append("the peers document names no server for this writer")
        for address in addresses:
            try:
                held = PeerClient(address, self.credentials, timeout=self.ask_timeout
                                  ).steps(m.writer)
                if want.step not in held:
                    problems.append(f"{address}: holds steps {held[:8]}, not {want.step}")
                    continue
                root = self._directory() / f"w{m.writer}-step{want.step}"
                space.check_room(root.parent, m.total_bytes)
                tier = LocalTier(root)
                try:
                    PeerClient(address, self.credentials, timeout=self.fetch_timeout
                               ).fetch_step(m.writer, want.step, root / ".incoming",
                                            tier.step_dir(want.step), writers=m.writers,
                                            expected=m)
                except BaseException:
                    shutil.rmtree(root, ignore_errors=True)
                    raise
                return root
            except (CkptdrainError, OSError) as err:
                problems.append(f"{address}: {err}")
        log.warning("peer tier: writer %d step %d not used, the next tier serves it: %s",
                    m.writer, want.step, "; ".join(problems))
        return None

    def _directory(self) -> Path:
        with self._guard:
            if self._root is None:
                if self.cache_dir is not None:
                    Path(self.cache_dir).mkdir(parents=True, exist_ok=True)
                self._root = Path(tempfile.mkdtemp(prefix="ckptdrain-peer-",
                                                   dir=self.cache_dir))
            return self._root

    def close(self) -> None:
        """Remove the fetched copies (the links served from them break: close the
        reader first). The source stays usable: a later read fetches again."""
        with self._guard:
            root, self._root = self._root, None
            self.copies.clear()
            self.problems.clear()
            self._locks.clear()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def tier_sources(store: Store, local: Mapping[int, str | Path] | None = None, *,
                 cache_dir: str | Path | None = None, concurrency: int = 8,
                 environ: Mapping[str, str] | None = None) -> list[Source]:
    """The reader's tiers in order: local (where `local` maps writers to tier
    roots), the peer tier (when this container has its environment:
    `PeerSource.from_env`), then the store."""
    sources: list[Source] = [LocalSource(local)] if local else []
    peer = PeerSource.from_env(environ, cache_dir=cache_dir)
    if peer is not None:
        sources.append(peer)
    sources.append(GlobalSource(store, concurrency=concurrency))
    return sources
