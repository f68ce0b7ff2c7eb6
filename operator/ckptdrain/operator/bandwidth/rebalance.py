"""The bandwidth budgets: each policy's share of the cluster cap, published
to its agents (the share channel and the cluster scale, bandwidth/share_channel.py),
and the status conditions that say so. Handlers only schedule these passes
(`schedule`); one coalesced pass per policy, and one JOINT pass that
re-statuses and rebalances every policy whose joint budget moved.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from ckptdrain import sizing
from ckptdrain.contract import api
from ckptdrain.operator import metrics
from ckptdrain.operator.apiserver import class_view, leadership, namespace_labels
from ckptdrain.operator.bandwidth import (
    allocation_status,
    answer_memo,
    joint_order,
    policy_changes,
    share_channel,
)
from ckptdrain.operator.bandwidth import budgets as jb

# Re-exported: the handlers read policies through this module.
from ckptdrain.operator.bandwidth.policy_parse import class_condition as class_condition
from ckptdrain.operator.bandwidth.policy_parse import parse_policy as parse_policy
from ckptdrain.operator.coalesce import Coalescer
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import allocation, class_catalogue, classes
from ckptdrain.operator.policy import spec as pol

Key = tuple[str, str]
REBALANCE_DELAY_S = 0.5
RETRY_DELAY_S = 5.0
#: Not a policy (no policy is nameless): the one coalesced pass that
#: re-statuses and rebalances every policy whose joint budget moved.
JOINT: Key = ("", "")

#: One per policy, also held by its record pass (handlers.py).
locks: defaultdict[Key, threading.Lock] = defaultdict(threading.Lock)
_rebalances = Coalescer("rebalancing", RETRY_DELAY_S)
#: Each policy's sizing and cluster share as the last joint pass computed
#: them. A policy's own reconcile may patch a budget computed before every
#: policy was indexed, and another writer of the conditions may patch from an
#: index that had not yet seen the joint pass's patch; either can land after
#: the pass that corrected it. Its event then disagrees with this, and another
#: joint pass follows.
_joint_last: dict[Key, tuple[sizing.Sizing, allocation.ClusterShare]] = {}
#: One joint pass at a time: an older pass finishing after a newer one would
#: write its older budgets and leave `_joint_last` agreeing with them.
_joint_lock = threading.Lock()
#: Parsed policies and the last joint split, so a pass re-parses and re-sizes
#: only what changed (bandwidth/budgets.py).
_joint = jb.JointBudgets()
#: namespace_labels.version() the last joint pass parsed with: any other means
#: the shares may have moved since, whoever read the labels (a label changed,
#: a namespace read at last, a reading dropped); a joint pass is asked then.
_joint_labels = namespace_labels.version()


#: Told of each policy event (handlers.py); see PolicyChanges.
changes = policy_changes.PolicyChanges()
#: How long a full answer may be reused at most, even with no change told:
#: bounds any change the policy events did not report (an indexer that
#: updated the index but whose object's handlers never ran).
REUSE_S = 5.0


#: The last full answer of `budgets`, reused by a policy's own pass.
_answers = answer_memo.AnswerMemo()


def values(index: kopf.Index[Key, Any], key: Key) -> list[Any]:
    return [v for v in index.get(key, []) if v is not None]


def stale(key: Key, body: Mapping[str, Any]) -> bool:
    """The policy's status says another budget or constraint than the last
    joint pass computed for it (a late, stale patch landed after it)."""
    last = _joint_last.get(key)
    return bool((body.get("status") or {}).get("conditions")) and last is not None \
        and allocation_status.disagrees(body, *last)


def forget(key: Key) -> None:
    """A deleted policy: drop what the joint pass kept for it."""
    _joint_last.pop(key, None)
    _joint.forget(key)
    changes.seen(key, {}, deleted=True)


def _new_term() -> None:
    """Another replica computed and wrote the budgets while this one stood
    by: the last pass's figures are not what the statuses and channels now
    say, and would order the next pass's shrinks and raises against stale
    budgets."""
    with _joint_lock:
        _joint_last.clear()
    changes.moved()


leadership.on_new_term(_new_term)


def budgets(cfg: OperatorConfig, policies: kopf.Index[Key, Any],
            pods: kopf.Index[Key, Any], fresh: dict[Key, pol.Policy] | None = None,
            read_untrusted: bool = True) -> dict[Key, jb.Budget]:
    """Each valid policy's sizing under the joint budget (its own cap applied,
    then the cluster cap jointly); `fresh` overrides what the index holds (`_budgets`)."""
    return _budgets(cfg, policies, pods, fresh, read_untrusted)[0]


def _budgets(cfg: OperatorConfig, policies: kopf.Index[Key, Any],
             pods: kopf.Index[Key, Any], fresh: dict[Key, pol.Policy] | None = None,
             read_untrusted: bool = True) -> tuple[dict[Key, jb.Budget], list[str]]:
    """`budgets`, and the namespaces not reached in time (their policies left out).

    Parsed from the labels held (namespace_labels.held), never read under
    the memo's lock. On the leader, unless not `read_untrusted` (a joint
    pass read before its lock), the namespaces with no trusted reading are
    read first, all within READ_TIMEOUT_S (namespace_labels.read_untrusted):
    after a start or a new term none is held, and the first policy
    reconciled would take the whole cap. Under a policy pass's lock that is
    bounded, one sweep at a time, and only while a reading is missing. An
    unread namespace's policies get no share; labels the last joint pass
    did not parse, or a namespace not reached, ask for one."""
    # Before the index is read: an answer is never filed under a version
    # newer than what it read (see policy_changes.py).
    version, at = changes.version, time.monotonic()
    bodies = {key: body for key in list(policies)
              for body in values(policies, key)[:1]}
    catalogue = class_view.current(classes.catalogue)
    needing = classes.namespaces_needing_labels(bodies, catalogue)
    unread = namespace_labels.read_untrusted(needing, cfg.namespace_recheck_s) \
        if read_untrusted and needing and leadership.active() else []
    # Before the parse, which takes the readings held, never reads: it runs
    # under the memo's lock.
    labels = namespace_labels.version()
    if needing and (unread or labels != _joint_labels) and leadership.active():
        # The joint pass reads on past a namespace not reached in time.
        schedule(JOINT, cfg, policies, pods, _log, RETRY_DELAY_S if unread else
                 REBALANCE_DELAY_S)
    answer = _joint.compute(bodies, {key: len(values(pods, key)) for key in bodies},
                            cfg.cluster_bandwidth,
                            lambda body, n: parse_policy(cfg, dict(body), n, catalogue,
                                                         read_labels=False),
                            _context(cfg, catalogue), fresh,
                            weights={**dict(cfg.bandwidth_weights),
                                     **class_catalogue.weights(bodies, catalogue)},
                            caps=class_catalogue.caps(bodies, catalogue))
    if not fresh and not unread:  # one missing a namespace is not reused
        _answers.keep(answer_memo.Answer(version, labels, cfg, answer,
                                         {k: jb.spec_stamp(b) for k, b in bodies.items()}, at))
    return answer, unread


_last_context: tuple[OperatorConfig, classes.Catalogue, int] | None = None


def _context(cfg: OperatorConfig, catalogue: classes.Catalogue
             ) -> tuple[OperatorConfig, classes.Catalogue, int]:
    """What parsed policies depend on, one object while none changes: the
    budgets' memo is kept while its context is the same object. The labels
    of namespaces are part of it: a namespace relabelled out of its
    policy's class takes the policy's share away with no change to it."""
    global _last_context
    last, labels = _last_context, namespace_labels.version()
    if last is None or last[0] is not cfg or last[1] is not catalogue or last[2] != labels:
        last = _last_context = (cfg, catalogue, labels)
    return last


def budget_of(cfg: OperatorConfig, policies: kopf.Index[Key, Any],
              pods: kopf.Index[Key, Any], key: Key) -> dict[Key, jb.Budget]:
    """`budgets` for one policy ({} if it has none): while no policy changed
    since the last full answer (REUSE_S at most), and the index still holds
    this policy as that answer read it, the answer's entry recounted for the
    policy's drainers now, with no pass over every policy and pod; one
    missing a namespace not reached, no more than the last joint pass."""
    reused = _reused(cfg, policies, pods, key)
    if reused is not None:
        return reused
    whole, unread = _budgets(cfg, policies, pods)
    mine = whole.get(key)
    if mine is not None and unread:  # split without some policies: until the joint pass
        mine = jb.no_more_than(mine, _joint_last.get(key))
    return {} if mine is None else {key: mine}


def _reused(cfg: OperatorConfig, policies: kopf.Index[Key, Any],
            pods: kopf.Index[Key, Any], key: Key) -> dict[Key, jb.Budget] | None:
    """`budget_of` from the last full answer; None when a full one is due."""
    last = _answers.last
    body = next(iter(values(policies, key)), None)
    if body is None:
        return {}  # gone (deleted, or its indexer failed): nothing to publish
    if last is None or not last.holds(changes.version, cfg, namespace_labels.version(),
                                      time.monotonic(), REUSE_S, key, jb.spec_stamp(body)):
        return None
    mine = last.budgets.get(key)
    if mine is None:
        return {}  # invalid as that answer read it, and unchanged since
    count = len(values(pods, key))
    if mine[1].counted != (count > 0):
        return None  # its first pod came or its last went: the split itself moved
    return {key: _joint.recounted(key, mine, count)}


def rebalance_moved(cfg: OperatorConfig, policies: kopf.Index[Key, Any],
                     pods: kopf.Index[Key, Any], logger: logging.Logger,
                     then: Key | None = None) -> None:
    """Rebalance (and so re-status) every policy whose joint budget moved, from
    one joint allocation: a burst of policy changes costs one pass, not one per
    policy; then `then`, whose own pass waited for it.

    On the leader the namespaces with no trusted reading are read first,
    outside the lock, all within READ_TIMEOUT_S; those not reached in time
    get no share, and the pass comes again in RETRY_DELAY_S."""
    global _joint_labels
    unread: list[str] = []
    if leadership.active():
        bodies = {key: body for key in list(policies) for body in values(policies, key)[:1]}
        unread = namespace_labels.read_untrusted(
            classes.namespaces_needing_labels(bodies, class_view.current(classes.catalogue)),
            cfg.namespace_recheck_s)
    with _joint_lock:
        # Before the parse: a version moved during it asks for another pass.
        _joint_labels = namespace_labels.version()
        _rebalance_moved_locked(cfg, policies, pods, logger, then)
    if unread and leadership.active():
        schedule(JOINT, cfg, policies, pods, logger, RETRY_DELAY_S)


def joint_behind() -> bool:
    """The namespace labels moved since the last joint pass parsed them."""
    return namespace_labels.version() != _joint_labels


def counted_moved(key: Key, pods: kopf.Index[Key, Any]) -> bool:
    """Whether `key` has pods now and had none at the last joint pass, or the
    other way round (or no joint pass has seen it): only policies with pods
    take part in the cluster cap's split, so every other policy's part moved."""
    last = _joint_last.get(key)
    return last is None or last[1].counted != bool(values(pods, key))


def _rebalance_moved_locked(cfg: OperatorConfig, policies: kopf.Index[Key, Any],
                            pods: kopf.Index[Key, Any], logger: logging.Logger,
                            then: Key | None = None) -> None:
    started = changes.joint_started()
    joint = budgets(cfg, policies, pods, read_untrusted=False)
    if joint and leadership.active():
        # One write per namespace tells every agent a smaller factor; the
        # channels are rewritten below where budgets grew or more than the
        # factor moved.
        _publish_scale("", joint, cfg, policies, pods, logger)
    # Shrinks before raises, and a larger factor between them, so the
    # cluster's sum never passes a cap on the way; a channel is rewritten
    # where its status or what it last said disagrees (bandwidth/joint_order.py).
    steps, raised = joint_order.plan(
        joint_order.targets(joint, share_channel.namespace_factors(joint),
                            share_channel.placed),
        {k: v[0].allowed_bandwidth for k, v in _joint_last.items()},
        {k: share_channel.written(k) for k in joint})
    for step in steps:
        key = step.key
        sized, cluster, _ = joint[key]
        if step.raise_first and leadership.active():
            _publish_scale("", joint, cfg, policies, pods, logger, may_raise=True)
        _joint_last[key] = (sized, cluster)
        body = next(iter(values(policies, key)), {})
        if step.rewrite or allocation_status.disagrees(body, sized, cluster):
            _rebalance(key, cfg, policies, pods, logger, joint)
            then = None if key == then else then
    if not raised and joint and leadership.active():
        _publish_scale("", joint, cfg, policies, pods, logger, may_raise=True)
    if then is not None and then in joint:
        # Last: every other policy's channel that shrinks is out before this
        # one counts (and a second later admits) its first pod's drain.
        _rebalance(then, cfg, policies, pods, logger, joint)
    changes.joint_finished(started)


_scale_log = logging.getLogger("ckptdrain.operator.scale")
_log = logging.getLogger("ckptdrain.operator.rebalance")


def _publish_scale(namespace: str, joint: Mapping[Key, jb.Budget], cfg: OperatorConfig,
                   policies: kopf.Index[Key, Any], pods: kopf.Index[Key, Any],
                   logger: logging.Logger, may_raise: bool = False) -> bool:
    """share_channel.publish_joint_scale, the budgets now taken from the index."""
    return share_channel.publish_joint_scale(
        namespace, joint, cfg.cluster_bandwidth,
        lambda: budgets(cfg, policies, pods, read_untrusted=False),  # under a pass's lock
        may_raise=may_raise, active=leadership.active, log=_scale_log.warning)


def _rebalance(key: Key, cfg: OperatorConfig, policies: kopf.Index[Key, Any],
               pods: kopf.Index[Key, Any], logger: logging.Logger,
               joint: dict[Key, jb.Budget] | None = None) -> None:
    with locks[key], metrics.reconciling("allocation"):
        single = joint is None
        if joint is None:
            joint = budget_of(cfg, policies, pods, key)
        mine = joint.get(key)
        if mine is None:
            return
        sized, cluster, policy = mine
        drainers = values(pods, key)
        body = next(iter(values(policies, key)), {})
        if not leadership.active():
            share_channel.forget()  # a standby's indexes are frozen: publish nothing
            return
        draining = [share_channel.Drainer(d.pod, share_channel.rank_of(d.writer))
                    for d in drainers if (d.pending_bytes or 0) > 0]
        # A smaller factor goes out first, everywhere; the channel then leaves
        # shrinks to it, unless the scale is not in place or an agent cannot read it.
        readable = _publish_scale(key[0], joint, cfg, policies, pods, logger) \
            and all(d.follows_scale for d in drainers)
        wanted = share_channel.claims(key[0], cluster) if readable else None
        budget = sized.allowed_bandwidth
        ceiling = share_channel.ceiling(key)
        if single and wanted is None and ceiling is not None and budget > ceiling \
                and (changes.joint_pending() or joint_behind() or readable):
            # Its agents are to read no claim (or its factor is not its
            # namespace's scale yet): what they apply grows only once the
            # joint pass has written the channels that shrink.
            budget = ceiling
            schedule(JOINT, cfg, policies, pods, logger)
        written, recheck = share_channel.publish(
            key, budget, policy.per_drainer_cap, draining,
            max(policy.writers, len(drainers)), share_channel.owner_of(body),
            time.monotonic(), lambda: api.timestamp(datetime.now(UTC)),
            wanted=wanted, carried=cluster.carried)
        if written:
            metrics.ALLOCATION_CHANGES.labels(*key).inc()
            logger.info("share channel %s/%s: %d of %d pods draining (budget %d B/s)",
                        *key, len(draining), len(drainers), int(sized.allowed_bandwidth))
        if recheck is not None:
            # A drainer waits to be admitted, or a heartbeat is due: come back.
            schedule(key, cfg, policies, pods, logger, max(recheck, 0.05))
        if body:
            allocation_status.write(key, body, sized, cluster, policy, drainers)


def schedule(key: Key, cfg: OperatorConfig, policies: kopf.Index[Key, Any],
                        pods: kopf.Index[Key, Any], logger: logging.Logger,
                        delay: float = REBALANCE_DELAY_S) -> None:
    """Rebalance `key` soon, once, however many events ask (indexes are live views);
    JOINT: every policy whose joint budget moved."""
    _rebalances.schedule(key, lambda: run(key, cfg, policies, pods, logger), logger, delay)


def run(key: Key, cfg: OperatorConfig, policies: kopf.Index[Key, Any],
        pods: kopf.Index[Key, Any], logger: logging.Logger) -> None:
    """One scheduled pass: `key`'s own, or the joint one when its first pod
    came or its last went (the split moved for all: every other channel that
    shrinks is out before this one counts its drainers)."""
    if key == JOINT:
        rebalance_moved(cfg, policies, pods, logger)
    elif counted_moved(key, pods):
        changes.moved()
        rebalance_moved(cfg, policies, pods, logger, then=key)
    else:
        _rebalance(key, cfg, policies, pods, logger)
