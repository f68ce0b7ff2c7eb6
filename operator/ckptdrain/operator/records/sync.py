"""One pass over a policy's Checkpoint records: the writers' progress folded
into a record (made when a step first appears), its owner, then retention
and the policy's recovery point. The handlers schedule it once per burst of
progress reports per step (operator/coalesce.py); this module makes the
writes, from the pods, the records and the policy as indexed.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ckptdrain.contract import api, progress
from ckptdrain.contract.progress import Claim
from ckptdrain.contract.record import build_record
from ckptdrain.errors import InvalidInput
from ckptdrain.operator import metrics
from ckptdrain.operator.apiserver import kube
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import spec as pol
from ckptdrain.operator.policy import status as st
from ckptdrain.operator.records import aggregate as records

Key = tuple[str, str]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriterProgress:
    """One pod's progress annotation, read and checked (contract/progress.py)."""

    pod: str
    node: str | None
    writer: int
    steps: Mapping[int, Claim]
    #: The writers its checkpoints wait for, as the agent was told.
    writers: int = 1
    #: The pod's creationTimestamp (set by the apiserver): of two pods of
    #: one rank, the newer one speaks for it.
    created: str = ""


#: The progress annotation each pod (by uid) had at its last event, so an
#: event folds only the steps whose claims moved (one entry per live pod).
_seen: dict[str, Mapping[int, Claim]] = {}
_seen_lock = threading.Lock()


def progress_of(pod: str, node: str | None, text: str | None, uid: str,
                rank_label: str | None = None, created: str | None = None
                ) -> WriterProgress | None:
    """A pod's progress, or None without one. A malformed annotation (it is
    the pod's to write: anything can be in it), or one that speaks for
    another rank than the pod's `ckptdrain.io/writer` label, counts as none,
    logged once per distinct value."""
    if not text:
        return None
    try:
        found = progress.parse(text)
        if rank_label is not None and str(found.writer) != rank_label:
            raise InvalidInput(f"{progress.ANNOTATION_PROGRESS}.writer",
                               f"the pod's own rank {rank_label!r} (label {api.LABEL_WRITER})",
                               found.writer)
    except InvalidInput as err:
        digest = hashlib.sha256(text.encode()).hexdigest()
        with _seen_lock:
            logged = _refused.get(uid) == digest
            _refused[uid] = digest
        if not logged:
            log.warning("pod %s: its progress is ignored: %s", pod, err)
        return None
    return WriterProgress(pod=pod, node=node or None, writer=found.writer, steps=found.steps,
                          writers=found.writers, created=created or "")


#: Digest of the last refused annotation per pod (uid): logged once each.
_refused: dict[str, str] = {}


def changed_steps(uid: str, text: str | None, deleted: bool) -> list[int]:
    """Steps whose claim this pod event changed (a deleted pod changes none:
    the record keeps what it said)."""
    if deleted:
        with _seen_lock:
            _seen.pop(uid, None)
            _refused.pop(uid, None)
        return []
    steps: Mapping[int, Claim] = {}
    if text:
        try:
            steps = progress.parse(text).steps
        except InvalidInput:
            steps = {}
    with _seen_lock:
        before = _seen.get(uid, {})
        if steps:
            _seen[uid] = steps
        else:
            _seen.pop(uid, None)
    return sorted(s for s, c in steps.items() if before.get(s) != c)


#: Pods deleted lately, with the progress their last event carried: a pod's
#: final word (an emergency checkpoint's Global, written as it stops) often
#: lands just before its deletion, after the index already dropped it, so
#: it is kept until the passes it scheduled have folded it in.
DEPARTED_KEEP_S = 600.0
_departed: dict[Key, dict[str, tuple[float, WriterProgress]]] = {}


def depart(key: Key, uid: str, gone: WriterProgress | None, now: float) -> list[int]:
    """Keep a deleted pod's last progress for DEPARTED_KEEP_S; its steps."""
    with _seen_lock:
        _seen.pop(uid, None)
        _refused.pop(uid, None)
        if gone is None:
            return []
        _departed.setdefault(key, {})[uid] = (now, gone)
    return sorted(gone.steps)


def with_departed(key: Key, writers: Iterable[WriterProgress], now: float
                  ) -> list[WriterProgress]:
    """The live pods' progress and that of the pods deleted lately."""
    with _seen_lock:
        kept = _departed.get(key, {})
        for uid in [u for u, (at, _) in kept.items() if now - at > DEPARTED_KEEP_S]:
            del kept[uid]
        if not kept:
            _departed.pop(key, None)
        gone = [w for _, w in kept.values()]
    return [*writers, *gone]


def claims_for(writers: Iterable[WriterProgress], step: int,
               expected: int | None = None) -> dict[int, Claim]:
    """Rank → claim for one step, from every pod that has one and waits for
    `expected` writers (None: any); of two pods of one rank, the newer pod
    (then the newer claim) speaks for it."""
    out: dict[int, tuple[tuple[str, str], Claim]] = {}
    for w in writers:
        claim = w.steps.get(step)
        if claim is None or (expected is not None and w.writers != expected):
            continue
        order = (w.created, claim.at or "")
        held = out.get(w.writer)
        if held is None or order >= held[0]:
            out[w.writer] = (order, claim)
    return {rank: claim for rank, (_, claim) in out.items()}


def writers_for(writers: Iterable[WriterProgress], step: int) -> int | None:
    """How many writers a new record of `step` waits for: what most of the
    pods that name the step were told (ties: the larger count, which can
    only make the record complete later, never sooner); None if none does."""
    counts: dict[int, int] = {}
    for w in writers:
        if step in w.steps:
            counts[w.writers] = counts.get(w.writers, 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda n: (counts[n], n))


def summarise(key: Key, record: str | None, step: int | None,
              writers: list[WriterProgress], cfg: OperatorConfig,
              recs: list[dict[str, Any]], policy_body: Mapping[str, Any] | None,
              lock: threading.Lock, logger: logging.Logger) -> None:
    """Fold the writers' progress on `step` (from their pods) into `record`
    (None: only sweep, e.g. after a deletion), making it when a writer first
    names the step (records.may_make); then sweep the policy (`recs`: its
    records as indexed; `lock`: the policy's)."""
    with metrics.reconciling("checkpoint"):
        body = next((r for r in recs if r.get("metadata", {}).get("name") == record),
                    None) if record else None
        if record is not None and step is not None:
            fresh = _fold(key, record, step, writers, body, recs, policy_body)
            # The index has not seen our write yet: the sweep below must
            # (a recovery point without its completion time otherwise).
            recs = [r for r in recs if r.get("metadata", {}).get("name") != record]
            if fresh is not None:
                recs.append(fresh)
            body = fresh
        if body is not None:
            owner = records.owner_patch(body, (policy_body or {}).get("metadata", {})
                                        .get("uid"))
            if owner:
                kube.patch_object(api.CHECKPOINTS, key[0], record or "", owner)
        sweep(key, cfg, recs, policy_body, lock, logger)


#: Attempts at a fold whose record keeps changing under it.
FOLD_ATTEMPTS = 4


def _fold(key: Key, name: str, step: int, writers: list[WriterProgress],
          body: dict[str, Any] | None, recs: list[dict[str, Any]],
          policy_body: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Write the fold of the writers' claims into the record, conditional on
    the version it was folded from: the operator's own previous write may not
    be in the index yet, and folding twice from the same stale copy would
    count a writer's bytes twice. The record as written; None when there is
    none. Only pods told the record's writer count (`spec.writers`) count."""
    for _ in range(FOLD_ATTEMPTS):
        if body is None:
            expected = writers_for(writers, step)
            if expected is None or policy_body is None:
                return None
            claims = claims_for(writers, step, expected)
            if not records.may_make(step, claims, recs):
                return None  # expired (or superseded) already: never made again
            meta = policy_body.get("metadata", {})
            new = build_record(key[0], key[1], step, expected, meta.get("uid"))
            body = kube.create_own(api.CHECKPOINTS, key[0], new) \
                or kube.read_own(api.CHECKPOINTS, key[0], name)
            if body is None:
                return None  # deleted as soon as made
        expected = int((body.get("spec") or {}).get("writers") or 1)
        change = records.fold(body, claims_for(writers, step, expected), datetime.now(UTC))
        if not change:
            return body
        version = str(body.get("metadata", {}).get("resourceVersion") or "")
        result = kube.patch_status_at(api.CHECKPOINTS, key[0], name, change, version)
        if result == "ok":
            return {**body, "status": {**(body.get("status") or {}), **change}}
        if result == "gone":
            return None
        body = kube.read_own(api.CHECKPOINTS, key[0], name)
        if body is None:
            return None
    raise RuntimeError(f"checkpoint {key[0]}/{name} changed under {FOLD_ATTEMPTS} folds "
                       "in a row; trying again later")


def completions(key: Key, indexed: Iterable[Mapping[str, Any]],
                logger: logging.Logger) -> list[tuple[int, str]]:
    """(step, completionTime) of the policy's complete records, for its
    history at a move (policy/history.py): as the apiserver has them, since
    the index may not hold the fold that completed one a moment before the
    move yet; as indexed when the apiserver cannot be asked."""
    try:
        found = kube.list_own(api.CHECKPOINTS, key[0], f"{api.LABEL_POLICY}={key[1]}")
    except (kube.ApiException, kube.HTTPError) as error:
        logger.warning("records of %s/%s could not be listed, using the index: %s",
                       key[0], key[1], error)
        found = list(indexed)
    return records.completions(r for r in found
                               if (r.get("spec") or {}).get("policy") == key[1])


def sweep(key: Key, cfg: OperatorConfig, recs: list[dict[str, Any]],
          policy_body: Mapping[str, Any] | None, lock: threading.Lock,
          logger: logging.Logger) -> None:
    """Retention and the policy's recovery point, from the records of one policy."""
    keep = pol.DEFAULT_GLOBAL_KEEP
    if policy_body is not None:
        keep = (policy_body.get("spec", {}).get("storage") or {}).get("keep", keep)
    now = datetime.now(UTC)
    with lock:
        for rec_name in records.to_expire(recs, keep, now):
            kube.patch_status(api.CHECKPOINTS, key[0], rec_name,
                              {"state": "Expired", "expiredTime": api.timestamp(now)})
            metrics.RETENTION_EXPIRED.labels(*key).inc()
            logger.info("expired checkpoint %s/%s (keep=%s)", key[0], rec_name, keep)
        for rec in expired_past_ttl(recs, cfg.expired_ttl_s, now):
            kube.delete(api.CHECKPOINTS, key[0], rec)
        if policy_body is None:
            return
        local, glob, when = records.latest_steps(recs)
        wanted = st.recovery_fields(local, glob, when)
        current = policy_body.get("status") or {}
        if any(current.get(k) != v for k, v in wanted.items()):
            kube.patch_status(api.POLICIES, key[0], key[1], wanted)


def expired_past_ttl(recs: Iterable[dict[str, Any]], ttl_s: float,
                     now: datetime) -> list[str]:
    out = []
    for rec in recs:
        status = rec.get("status") or {}
        if status.get("state") != "Expired" or not status.get("expiredTime"):
            continue
        since = api.parse_timestamp(status["expiredTime"])
        if now - since >= timedelta(seconds=ttl_s):
            out.append(rec["metadata"]["name"])
    return out
