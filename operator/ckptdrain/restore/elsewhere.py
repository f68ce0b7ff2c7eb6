"""Restore after the policy's store moved: what the policy's history
(CKPTDRAIN_EARLIER_STORES, newest first) forbids, and the messages that say
so. Pure.

Two things would silently throw training away, and restore refuses both
with outcome `history_elsewhere` (exit 5):
- nothing at the new prefix, in the store or on the node, while the history
  names a step elsewhere: that is no fresh start;
- a step here older than one the history names elsewhere (a move back to
  a prefix the policy trained past elsewhere): restoring it would go back.
Each message names both places and the two ways on: copy the checkpoints
over, or set spec.relocation.startFresh with a new reason (the operator
then stops telling pods the history: operator/policy/history.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from ckptdrain.contract.earlier_stores import EarlierStore
from ckptdrain.node import config as node_config
from ckptdrain.restore.agreement import Decision

FRESH = "set spec.relocation.startFresh: true with a new spec.relocation.reason"


def newer(cfg: node_config.AgentConfig, step: int) -> EarlierStore | None:
    """The earlier prefix with the newest step, when that step is newer than
    `step`; None when restoring `step` loses nothing the history knows of."""
    best = max(cfg.earlier_stores, key=lambda s: s.step, default=None)
    return best if best is not None and best.step > step else None


def _here(cfg: node_config.AgentConfig) -> str:
    return cfg.store_uri or "the configured tiers"


def _there(store: EarlierStore) -> str:
    why = f' ("{store.reason}")' if store.reason else ""
    return (f"this policy's checkpoints reached step {store.step} under {store.uri} before it "
            f"moved on {store.moved_at or 'an unknown date'}{why}")


def _copy(cfg: node_config.AgentConfig, store: EarlierStore) -> str:
    return f"copy {store.uri.rstrip('/')}/ to {_here(cfg).rstrip('/')}/ with the store's tools"


def nothing_here(cfg: node_config.AgentConfig) -> str:
    """Why nothing found is no fresh start: the newest earlier prefix."""
    last = cfg.earlier_stores[0]
    return (f"nothing under {_here(cfg)}, but {_there(last)}: {_copy(cfg, last)}, or "
            f"{FRESH} to start from step 0")


def older_here(cfg: node_config.AgentConfig, step: int, store: EarlierStore) -> str:
    """Why the newest step here is not restored: the history names a newer one."""
    return (f"step {step} is the newest this restore could use here ({_here(cfg)}), but "
            f"{_there(store)}: {_copy(cfg, store)} to resume from step {store.step}, or "
            f"{FRESH} to restore step {step}")


def agreed_on_none(cfg: node_config.AgentConfig, decision: Decision,
                   found: Iterable[int]) -> str:
    """Why a decision of no step is no fresh start for a rank that found steps
    (the decision may predate them: a copy that landed since)."""
    shown = ", ".join(str(s) for s in sorted(set(found), reverse=True)[:3])
    last = cfg.earlier_stores[0]
    return (f"ranks agreed on no step in round {decision.round} ({decision.detail}), but this "
            f"rank found step(s) {shown} and {_there(last)}: no fresh start; its next try "
            f"starts a new round (if they agree on none again: {_copy(cfg, last)}, or {FRESH} "
            "to start from step 0)")
