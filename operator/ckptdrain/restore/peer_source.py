"""Restore from the peer tier: ask each writer's holder (named in the mounted
peers document, so this works while the operator is down) which copies it
holds, and fetch this writer's copy of the chosen step, verified.

For a step the peers make whole (restore/peer_plan.py), this writer's own
local copy is tried first, but only when its content equals the holder's
copy (the manifest is read from the holder; a different pod with the same
rank may have left other bytes under the same step number). Then the
holder's copy, every byte checked against its manifest's CRC32C. A bad or
missing copy raises, and restore falls back to the next candidate.
"""

from __future__ import annotations

import logging
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ckptdrain.contract.peers import PeerView
from ckptdrain.errors import CkptdrainError, IntegrityError
from ckptdrain.manifest import WriterManifest
from ckptdrain.node import durable, space
from ckptdrain.node.config import AgentConfig
from ckptdrain.node.localtier import DATA, LocalTier
from ckptdrain.peer import config as peer_config
from ckptdrain.peer.client import PeerClient, PeerUnavailable
from ckptdrain.peer.config import PeerConfig
from ckptdrain.restore.peer_plan import peer_steps
from ckptdrain.restore.plan import Candidate
from ckptdrain.restore.result import RestoreResult, Skipped

log = logging.getLogger(__name__)

#: Seconds to wait for a holder's list of steps (a lost node never answers).
ASK_TIMEOUT = 5.0
ASK_WORKERS = 16
#: Seconds a fetch may wait for each read (the copy itself may take minutes).
FETCH_TIMEOUT = 30.0


def servers_for(view: PeerView, writer: int) -> list[str]:
    """The peer servers that may serve `writer`'s copies: its holder, its previous
    holder, then its own node's (which serves that writer's local tier read-only)."""
    addresses = view.holder_addresses(writer)
    own = view.address(writer)
    if own is not None and own not in addresses:
        addresses.append(own)
    return addresses


@dataclass
class PeerSource:
    cfg: AgentConfig
    pcfg: PeerConfig
    view: PeerView
    #: writer -> {step: [holder addresses holding it]}
    held: dict[int, dict[int, list[str]]] = field(default_factory=dict)
    #: Holders that could not be asked, with the reason (restore reports them).
    problems: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, cfg: AgentConfig) -> PeerSource | None:
        """None when the peer tier is off or its document is not there yet."""
        pcfg = peer_config.load(cfg.policy)
        if pcfg is None:
            return None
        view = pcfg.view()
        if view is None:
            log.warning("peer tier: no readable peers document at %s", pcfg.peers_file)
            return None
        return cls(cfg, pcfg, view)

    def _client(self, address: str, timeout: float = FETCH_TIMEOUT) -> PeerClient:
        return PeerClient(address, self.pcfg.credentials, timeout=timeout)

    def ask(self) -> None:
        """Learn, for every writer, which steps its holder(s) hold, and which its own
        node still holds locally (asked of its own peer server, this writer's
        included): every writer asks the same servers, so every writer sees the
        same answer and all choose the same step. Asked in parallel, with a short
        timeout: a lost node's address does not answer at all."""
        asks = []
        for writer in range(self.cfg.writers):
            asks += [(writer, address) for address in servers_for(self.view, writer)]
            self.held[writer] = {}

        def one(ask: tuple[int, str]) -> tuple[int, str, list[int] | str]:
            writer, address = ask
            try:
                return writer, address, self._client(address, ASK_TIMEOUT).steps(writer)
            except CkptdrainError as err:
                return writer, address, str(err)

        with ThreadPoolExecutor(max_workers=max(1, min(ASK_WORKERS, len(asks)))) as pool:
            for writer, address, answer in pool.map(one, asks):
                if isinstance(answer, str):
                    self.problems.append(f"peer server for writer {writer} at {address}: {answer}")
                    continue
                for step in answer:
                    self.held[writer].setdefault(step, []).append(address)

    def summary(self, writers: int = 8, steps: int = 4) -> str:
        """What the holders answered, short: 'writer 0: 100, 0; writer 1: none'."""
        parts = []
        for writer in sorted(self.held)[:writers]:
            held = sorted(self.held[writer], reverse=True)
            shown = ", ".join(str(s) for s in held[:steps]) + (", …" if len(held) > steps else "")
            parts.append(f"writer {writer}: {shown or 'none'}")
        more = len(self.held) - writers
        return "; ".join(parts) + (f"; {more} more writers" if more > 0 else "")

    def steps(self, global_steps: list[int]) -> list[int]:
        return peer_steps(self.cfg.writers, {w: list(h) for w, h in self.held.items()},
                          global_steps)

    def restore_step(self, step: int, tmp: Path, tier: LocalTier) -> tuple[int, str, str]:
        """Put this writer's files of `step` at `tmp`: (bytes, source, tier used)."""
        addresses = self.held.get(self.cfg.writer, {}).get(step, [])
        if not addresses:
            raise PeerUnavailable(f"no holder has writer {self.cfg.writer} step {step}")
        errors: list[str] = []
        for address in addresses:
            client = self._client(address)
            try:
                held = client.manifest(self.cfg.writer, step, writers=self.cfg.writers)
                if tier.has(step) and tier.manifest(step).same_content(held):
                    try:
                        return self._from_local(tier, step, held, tmp), \
                            str(tier.step_dir(step)), "local"
                    except (CkptdrainError, OSError) as err:
                        shutil.rmtree(tmp, ignore_errors=True)
                        errors.append(f"own local copy: {err}")
                space.check_room(tmp.parent, held.total_bytes)
                return self._fetch(client, step, held, tmp), \
                    f"peer {address} writer {self.cfg.writer} step {step}", "peer"
            except (CkptdrainError, OSError) as err:
                errors.append(f"{address}: {err}")
        raise IntegrityError("; ".join(errors))

    def _from_local(self, tier: LocalTier, step: int, held: WriterManifest, tmp: Path) -> int:
        space.check_room(tmp.parent, held.total_bytes)
        durable.copy_tree(tier.data_dir(step), tmp, files=[f.path for f in held.files],
                          expected={f.path: f for f in held.files})
        return held.total_bytes

    def _fetch(self, client: PeerClient, step: int, held: WriterManifest, tmp: Path) -> int:
        stage = tmp.with_name(f"{tmp.name}-peer")
        shutil.rmtree(stage, ignore_errors=True)
        final = stage / "copy"
        try:
            client.fetch_step(self.cfg.writer, step, stage / "incoming", final,
                              writers=self.cfg.writers, expected=held)
            os.rename(final / DATA, tmp)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        return held.total_bytes


def candidates(cfg: AgentConfig, global_steps: list[int], result: RestoreResult
               ) -> tuple[PeerSource | None, list[Candidate]]:
    """The peer tier's candidates (steps it makes whole that the global tier
    lacks), newest first; problems asking the holders go into `result.skipped`."""
    try:
        source = PeerSource.open(cfg)
    except CkptdrainError as err:
        result.skipped.append(Skipped(None, "peer", f"peer tier misconfigured: {err}"))
        return None, []
    if source is None:
        return None, []
    source.ask()
    for problem in source.problems:
        result.skipped.append(Skipped(None, "peer", problem))
    steps = source.steps(global_steps)
    if not steps:
        # Say what was there: a peer tier that restores nothing is otherwise
        # silent, and "why not the partner?" is the first question after a loss.
        result.skipped.append(Skipped(None, "peer", "no step newer than the global tier's "
                                      "that every writer can get; held: " + source.summary()))
    return source, [Candidate(step, "peer") for step in steps]
