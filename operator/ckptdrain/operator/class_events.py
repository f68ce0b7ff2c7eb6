"""CheckpointClass changes reach the policies they decide for.

A policy is reconciled when its own spec changes; a class created, changed
or deleted changes what its policies may do without touching them. On each
class event the operator judges again every policy that names a class
(policy/classes.py) and reconciles, as its handler does, each policy whose
ClassResolved condition would change, or whether and why it is Invalid
(a class that still takes a policy can make its spec unusable): a policy whose class was deleted
turns Invalid with ClassResolved False (its pods are then refused or
admitted bare at admission, as for any invalid policy), and back when the
class returns. Each class's own status says whether the operator can use
it (Accepted) and, among classes annotated default, which one is (Default).
A class's weight or cap (spec.bandwidthWeight, spec.bandwidthCap) that
moved asks for a joint budgets' pass (bandwidth/rebalance.py): its
policies' shares moved, though nothing a reconcile judges did.

A namespace relabelled changes what a class that allows namespaces by label
(spec.namespaces.selector) says of its policies, with no class event. The
operator does not watch namespaces (a watch of every namespace for the few
that hold such policies); a thread (`recheck`) reads, at start, when this
replica leads again and each CKPTDRAIN_NAMESPACE_RECHECK_PERIOD, the
labels of the namespaces whose policies name such a class, by `get`, and
judges those policies again: one GET per such namespace per period, on the
leading replica only, in at most RECHECK_BUDGET of a period. A pass that
ends with labels other than the last joint budgets' pass parsed asks for
one (bandwidth/rebalance.py).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

import kopf

from ckptdrain.contract import api
from ckptdrain.errors import InvalidInput
from ckptdrain.operator.apiserver import class_view, kube, leadership, namespace_labels, policy_edge
from ckptdrain.operator.bandwidth import rebalance
from ckptdrain.operator.coalesce import Coalescer
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import class_catalogue, class_placement, classes, version_messages
from ckptdrain.operator.policy import status as st
from ckptdrain.operator.policy_reconcile import reconcile_policy

CLASSES = (api.GROUP, "v1beta1", "checkpointclasses")
#: Policies to reconcile after a class event, one pass each, retried on failure.
_rejudged = Coalescer("reconciling policies after a class change")
#: The share of each recheck period one pass may take: a pass cut short
#: goes on at the next period rather than run into it.
RECHECK_BUDGET = 0.5
INDEXES = ("pod_index", "checkpointpolicy_index", "checkpoint_index", "peer_pod_index",
           "progress_index")


def stale(cfg: OperatorConfig, body: dict[str, Any]) -> bool:
    """The policy's status is not what its class makes of it now: its
    ClassResolved condition, or whether it is Invalid and why. A class
    may take a policy and still make its spec unusable (a store that no
    longer vouches for the endpoint of a policy without a Secret, an
    identity whose role is too long for its namespace): only the spec's
    own judgement under the class (spec.parse) tells.
    A policy without ClassResolved has not been reconciled by this
    operator yet: its own handler (create, resume) judges its class then,
    so the classes listed at start do not reconcile every policy once more.
    A policy that names no class was bound to none when it was created: no
    class event concerns it."""
    if not (body.get("spec") or {}).get("checkpointClassName"):
        return False
    status = body.get("status") or {}
    have = next((c for c in status.get("conditions") or []
                 if c.get("type") == st.CLASS_RESOLVED), None)
    if have is None:
        return False
    want = rebalance.class_condition(cfg, body)
    if any(have.get(k) != want[k] for k in ("status", "reason", "message")):
        return True
    return _invalid_said(status) != _invalid_now(cfg, body, status)


def _invalid_said(status: dict[str, Any]) -> str | None:
    """Why the stored status says the policy is Invalid; None: it does not."""
    if status.get("phase") != "Invalid":
        return None
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == st.READY), {})
    return str(ready.get("message") or "")


def _invalid_now(cfg: OperatorConfig, body: dict[str, Any], status: dict[str, Any]
                 ) -> str | None:
    """The message a reconcile would write for the policy's spec under its
    class now (as reconcile_policy words it); None: the spec is usable.
    Raises namespace_labels.LabelsUnreadable when it cannot be told."""
    try:
        rebalance.parse_policy(cfg, body, int(status.get("drainers") or 0))
    except namespace_labels.LabelsUnreadable:
        raise
    except InvalidInput as error:
        return version_messages.message(error, version_messages.versions_of(body))
    return None


@kopf.on.event(*CLASSES)
def checkpointclass_event(event: kopf.RawEvent, memo: kopf.Memo, logger: logging.Logger,
                          **kwargs: Any) -> None:
    # This event may reach Kopf before the process's own watch of classes:
    # the view takes it now, so the judgement below sees the change.
    class_view.CLASSES.apply(str(event.get("type") or "ADDED"), dict(event["object"]))
    cfg: OperatorConfig = memo.config
    indexes = {k: kwargs[k] for k in INDEXES}
    index: kopf.Index[Any, Any] = indexes["checkpointpolicy_index"]
    _rebalance_if_bandwidth_moved(cfg, logger, indexes)
    for key in list(index):
        body = _policy(index, key)
        if body is not None and _stale_or_unknown(cfg, body, logger):
            _schedule(key, memo, logger, indexes, "its class changed")
    if event.get("type") != "DELETED":
        _warn_stranded(dict(event["object"]), index, indexes["pod_index"])
    _class_statuses(logger)
    start_recheck(memo, logger, indexes)


#: Each class's (bandwidthWeight, bandwidthCap) as the last class event
#: saw them (None: none seen yet, as after a start).
_bandwidth_seen: dict[str, tuple[int | None, float | None]] | None = None


def _rebalance_if_bandwidth_moved(cfg: OperatorConfig, logger: logging.Logger,
                                  indexes: dict[str, Any]) -> None:
    """A joint budgets' pass when a class's weight or cap is not what the
    last class event saw (a class edited, added or deleted): its policies'
    shares moved with no change to them. Compared with what this handler
    last saw, not with the view before the event, which the process's own
    watch of classes may have brought up to date already."""
    global _bandwidth_seen
    now = class_catalogue.bandwidth_settings(class_view.current(classes.catalogue))
    if now == _bandwidth_seen:
        return
    _bandwidth_seen = now
    rebalance.changes.moved()  # no single policy's pass may reuse the last answer
    if leadership.active():
        rebalance.schedule(rebalance.JOINT, cfg, indexes["checkpointpolicy_index"],
                           indexes["pod_index"], logger)


def recheck(cfg: OperatorConfig, memo: kopf.Memo, logger: logging.Logger,
            indexes: dict[str, Any], budget_s: float) -> None:
    """One pass: the labels of each namespace whose policies name a class
    that allows namespaces by label read afresh (one GET each), and each
    of those policies whose status would change (`stale`) reconciled as a pass
    of its own (`_schedule`); a joint budgets' pass when the labels are
    not those the last one parsed.
    A namespace whose labels cannot be read is skipped (its policies keep
    their status) and tried at the next pass.
    The pass stops when this replica stops leading or after `budget_s`;
    the next one starts after the last namespace this one read."""
    _read_and_judge(cfg, memo, logger, indexes, budget_s)
    if rebalance.joint_behind() and leadership.active():
        # Labels moved since the last joint pass parsed them (read by this
        # pass or any other reader, or a reading grew too old): the
        # policies' shares of the cluster cap may have, with no
        # ClassResolved change to reconcile.
        rebalance.schedule(rebalance.JOINT, cfg, indexes["checkpointpolicy_index"],
                           indexes["pod_index"], logger)


def _read_and_judge(cfg: OperatorConfig, memo: kopf.Memo, logger: logging.Logger,
                    indexes: dict[str, Any], budget_s: float) -> None:
    global _recheck_after
    namespace_labels.expire(cfg.namespace_recheck_s)
    catalogue = class_view.current(classes.catalogue)
    index: kopf.Index[Any, Any] = indexes["checkpointpolicy_index"]
    by_namespace: dict[str, list[tuple[Any, dict[str, Any]]]] = {}
    for key in list(index):
        body = _policy(index, key)
        spec = (body or {}).get("spec") or {}
        if body is not None and spec.get("checkpointClassName") \
                and classes.needs_labels(spec, catalogue):
            by_namespace.setdefault(key[0], []).append((key, body))
    deadline = time.monotonic() + budget_s
    for namespace in rotation(sorted(by_namespace), _recheck_after):
        if not leadership.active():
            return  # a standby's indexes are not live; the leader judges
        if time.monotonic() >= deadline:
            logger.warning("namespace recheck: out of its %ss; the next pass goes on from "
                           "namespace %s", budget_s, namespace)
            return
        _recheck_after = namespace
        try:
            namespace_labels.fresh(namespace)
        except namespace_labels.READ_ERRORS as error:
            logger.warning("namespace %s: could not read its labels (%s); its policies "
                           "are judged again in %ss", namespace, error, cfg.namespace_recheck_s)
            continue
        for key, body in by_namespace[namespace]:
            if not leadership.active():
                return
            if _stale_or_unknown(cfg, body, logger) is True:
                _schedule(key, memo, logger, indexes, "its namespace's labels changed")


def rotation(names: list[str], after: str) -> list[str]:
    """`names` (sorted) starting with the first after `after`, wrapping
    round: a pass cut short by its budget does not starve the same tail."""
    cut = next((i for i, name in enumerate(names) if name > after), len(names))
    return names[cut:] + names[:cut]


#: The last namespace the recheck read: where the next pass goes on.
_recheck_after = ""


def _stale_or_unknown(cfg: OperatorConfig, body: dict[str, Any],
                      logger: logging.Logger) -> bool | None:
    """`stale`, or None when its namespace's labels cannot be read (no
    judgement: the policy keeps its status, and the recheck tries again)."""
    try:
        return stale(cfg, body)
    except namespace_labels.LabelsUnreadable as error:
        meta = body.get("metadata") or {}
        logger.warning("policy %s/%s: %s; judged again at the next namespace recheck",
                       meta.get("namespace"), meta.get("name"), error)
        return None


#: Set while the recheck thread runs (cleared, it ends at its next wake).
_recheck_started = threading.Event()
#: Set when a pass is due before the period is out: at start, and when this
#: replica leads again (every reading was forgotten, and Kopf resumes no
#: handler for a replica that led before).
_recheck_due = threading.Event()
_recheck_due.set()
leadership.on_term_started(lambda: _recheck_due.set())


def start_recheck(memo: kopf.Memo, logger: logging.Logger, indexes: dict[str, Any]) -> None:
    """Start `recheck` at once, then each CKPTDRAIN_NAMESPACE_RECHECK_PERIOD
    and at each new term, once per process. A thread, not a Kopf timer:
    timers would put a finalizer on every policy (records/watchdog.py).
    Called from a Kopf handler: the thread runs in a copy of its context,
    where Kopf's settings and event queue are (a reconcile posts Events with
    kopf.warn)."""
    if _recheck_started.is_set():
        return
    _recheck_started.set()
    cfg: OperatorConfig = memo.config
    context = contextvars.copy_context()
    running, due = _recheck_started, _recheck_due

    def loop() -> None:
        while running.is_set():
            due.wait(cfg.namespace_recheck_s)
            due.clear()
            if not running.is_set():
                return
            if not leadership.active():
                continue  # a standby's indexes are not live
            try:
                recheck(cfg, memo, logger, indexes, cfg.namespace_recheck_s * RECHECK_BUDGET)
            except (kube.ApiException, *namespace_labels.READ_ERRORS) as error:
                logger.warning("namespace recheck failed (%s); next in %ss", error,
                               cfg.namespace_recheck_s)
            except Exception:  # logged: the recheck must outlive one bad pass
                logger.exception("namespace recheck failed; next in %ss",
                                 cfg.namespace_recheck_s)

    threading.Thread(target=context.run, args=(loop,), name="ckptdrain-namespace-recheck",
                     daemon=True).start()


#: Each class's nodeSelector as last judged by `_warn_stranded`: only an
#: edit of it is warned about, not every other edit or status write of the
#: class, nor the first sight of a class (a start, a new class).
_selectors_seen: dict[str, tuple[tuple[str, str], ...]] = {}


def _warn_stranded(class_body: dict[str, Any], index: kopf.Index[Any, Any],
                   pods: kopf.Index[Any, Any]) -> None:
    """A Warning Event on each policy of the class whose nodeSelector was
    just edited, when live pods of the policy set a class key to another
    value (their replacements may be refused at admission, said otherwise
    only by the workload's FailedCreate Event)."""
    name = (class_body.get("metadata") or {}).get("name")
    cls = class_view.current(classes.catalogue).get(str(name))
    if not isinstance(cls, classes.CheckpointClass):
        _selectors_seen.pop(str(name), None)
        return
    before = _selectors_seen.get(cls.name)
    _selectors_seen[cls.name] = cls.placement.node_selector
    if before is None or before == cls.placement.node_selector:
        return
    for key in list(index):
        body = _policy(index, key)
        if body is None or (body.get("spec") or {}).get("checkpointClassName") != name:
            continue
        live = [(p.pod, dict(p.node_selector)) for p in pods.get(key, []) if not p.deleting]
        message = class_placement.stranded(live, cls.placement, cls.name)
        if message is not None:
            kopf.warn(kopf.Body(policy_edge.event_subject(body)), reason="PlacementChanged",
                      message=message)


def _policy(index: kopf.Index[Any, Any], key: Any) -> dict[str, Any] | None:
    return next((b for b in index.get(key, []) if b is not None), None)


def _schedule(key: Any, memo: kopf.Memo, logger: logging.Logger,
              indexes: dict[str, Any], why: str) -> None:
    """Reconcile one policy whose class (or namespace) changed, as a pass of
    its own: Kopf never retries an event handler, and a pass that fails (a status write
    that kept losing to other writers, an API error) is retried by the
    Coalescer, from the policy as the index then holds it; the other
    policies and the classes' own statuses do not wait for it. The pass runs
    in a copy of the caller's context (a Kopf handler's, or the recheck's,
    itself a copy of one): Kopf's settings and event queue are there, which
    the reconcile's Events need; a Coalescer worker thread has none."""
    context = contextvars.copy_context()

    def reconcile() -> None:
        if not leadership.active():
            return  # a standby's indexes are not live; the leader judges it
        body = _policy(indexes["checkpointpolicy_index"], key)
        if body is None or not _stale_or_unknown(memo.config, body, logger):
            return
        logger.info("policy %s/%s: %s; reconciling it", *key, why)
        reconcile_policy(body=kopf.Body(body), memo=memo, logger=logger, announce=False,
                         **indexes)

    def run() -> None:
        # A fresh copy each run: a retried pass may run while the last one's
        # context is still entered on another worker.
        context.copy().run(reconcile)

    _rejudged.schedule(key, run, logger, 0.0)


def _judged(bodies: list[dict[str, Any]]) -> dict[str, tuple[Any, list[dict[str, str]]]]:
    """Each class's stored conditions and the ones it should have."""
    wanted = class_catalogue.class_conditions(classes.catalogue(bodies))
    return {str(b["metadata"]["name"]): ((b.get("status") or {}).get("conditions"),
                                        wanted.get(str(b["metadata"]["name"]), []))
            for b in bodies}


def _class_statuses(logger: logging.Logger) -> None:
    """Accepted and Default on each class, where they changed (a class
    added or deleted can change another's Default)."""
    now = datetime.now(UTC)
    for name, (stored, wanted) in class_view.current(_judged).items():
        previous = stored or []
        kept = [c for c in previous if c.get("type") in
                (class_catalogue.ACCEPTED, class_catalogue.DEFAULT)]
        if [{k: c.get(k) for k in ("type", "status", "reason", "message")} for c in kept] \
                == wanted:
            continue
        conditions = [st.condition(c["type"], c["status"] == "True", c["reason"],
                                   c["message"], None, now, previous) for c in wanted]
        logger.info("CheckpointClass %s: %s", name,
                    ", ".join(f"{c['type']}={c['status']}" for c in wanted))
        kube.patch_cluster_status(CLASSES[2], name, {"conditions": conditions}, CLASSES[1])
