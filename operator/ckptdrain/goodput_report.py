"""`ckptdrain goodput`'s report: one policy's goodput, as text a person can
paste into a postmortem, or as JSON. Pure: the cluster is read elsewhere
(operator/goodput/command.py) and the clock is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from ckptdrain import goodput, units
from ckptdrain.contract.goodput import RESTORED_OUTCOMES, PodView


def build(policy: Mapping[str, Any], pods: Iterable[PodView], now: float
          ) -> dict[str, Any]:
    """The report of one policy: its status merged with the pods alive now
    (their blocked seconds, restores the operator may not have folded yet)."""
    meta = policy.get("metadata") or {}
    status = policy.get("status") or {}
    spec = policy.get("spec") or {}
    pods = list(pods)
    live_blocked = sum(p.agent.blocked_s for p in pods
                       if p.agent is not None and p.agent.interrupted_at is None)
    merged = goodput.merge(status.get("goodput") or {}, pods, status.get("lastGlobalStep"))
    created = str(meta.get("creationTimestamp") or "")
    try:
        since = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        since = now
    writers = int(spec.get("writers") or 1)
    sums = goodput.totals(merged, since, now, writers, live_blocked)
    return {"namespace": meta.get("namespace"), "policy": meta.get("name"),
            "since": created or None, "writers": writers,
            "lastLocalStep": status.get("lastLocalStep"),
            "lastGlobalStep": status.get("lastGlobalStep"),
            "recoveryPointTime": status.get("recoveryPointTime"),
            "recoveryPointOnNodeLoss": status.get("recoveryPointOnNodeLoss"),
            **{k: merged.get(k) for k in ("heldSince", "endedAt", "idleSeconds")},
            **sums,
            "interruptionsListed": [_clean(e) for e in merged.get("recent") or []],
            "lastRestoreFailure": status.get("lastRestoreFailure")}


def _clean(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k not in ("completed",)}


def _when(at: Any) -> str:
    if not isinstance(at, int | float):
        return "?"
    return datetime.fromtimestamp(float(at), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _secs(value: Any) -> str:
    return "?" if value is None else units.format_duration(float(value))


def _or(value: Any, unknown: str = "?") -> str:
    return unknown if value is None else str(value)


def _recovery_points(report: Mapping[str, Any]) -> str:
    """The step a restart would restore now: every node intact (the newest
    step every writer holds locally), and after a node loss (with the peer
    tier, the step every writer can still get; else the newest global step)."""
    glob = (f"global step {_or(report.get('lastGlobalStep'), '-')} "
            f"(at {report.get('recoveryPointTime') or '-'})")
    intact = f"local step {_or(report.get('lastLocalStep'), '-')} with every node intact"
    node_loss = report.get("recoveryPointOnNodeLoss")
    if node_loss is None:
        return f"{intact}; {glob} after a node loss"
    return f"{intact}; step {node_loss} after a node loss (peer tier); {glob}"


def text(report: Mapping[str, Any]) -> str:
    """The postmortem text of one policy's report."""
    ratio = report.get("runtimeGoodput")
    held = "-" if report.get("heldSince") is None else f"since {_when(report['heldSince'])}"
    if report.get("endedAt") is not None:
        held += f", pods ended {_when(report['endedAt'])}"
    lines = [
        f"CheckpointPolicy {report['namespace']}/{report['policy']} "
        f"({report['writers']} writer(s)), since {report.get('since') or '?'}",
        f"  job's resources       {held}",
        f"  runtime goodput       {'?' if ratio is None else f'{100 * ratio:.2f}%'} "
        f"(badput {_secs(report['badputSeconds'])} of {_secs(report['availableSeconds'])} "
        "with the job's resources)",
        f"  waiting for resources {_secs(report['waitingForResourcesSeconds'])} (interruption "
        "→ replacement pod on a node; not in the ratio)",
        f"  interruptions         {report['interruptions']}"
        + (f" ({report['open']} not training again yet)" if report.get("open") else ""),
        f"  steps lost            {report['lostSteps']} ({_secs(report['lostSeconds'])} "
        "of training redone)",
        f"  back to training      {_secs(report['recoverySeconds'])} in total (interruption "
        "→ training again: the wait, restore, load)",
        f"  blocked in saves      {_secs(report['blockedSeconds'])} (all writers)",
        f"  recovery point        {_recovery_points(report)}",
    ]
    failure = report.get("lastRestoreFailure")
    if failure:
        lines.append(f"  last failed restore   pod {failure.get('pod')}: "
                     f"{failure.get('outcome')}: {failure.get('reason')}")
    entries = report.get("interruptionsListed") or []
    if entries:
        lines.append("")
        lines.append("  when (UTC)               pod / writer             step  restorable "
                     "local/global  restored (tier)  lost steps / time  back after")
    for e in entries:
        restorable = f"{_or(e.get('restorableLocal'), '-')}/{_or(e.get('restorableGlobal'), '-')}"
        restored = "-" if e.get("restoreOutcome") is None else (
            f"{_or(e.get('restoredStep'), 'fresh')} ({e.get('restoredTier') or '-'})"
            if e.get("restoreOutcome") in RESTORED_OUTCOMES
            else f"FAILED: {e.get('restoreOutcome')}")
        lost = f"{_or(e.get('lostSteps'))} / {_secs(e.get('lostSeconds'))}"
        back = _secs(e.get("recoverySeconds")) if e.get("recoverySeconds") is not None \
            else "not yet"
        who = f"{e.get('pod')} / {_or(e.get('writer'))}"
        lines.append(f"  {_when(e.get('at')):24} {who:24} {_or(e.get('step')):>5} "
                     f"{restorable:>19}  {restored:15}  {lost:17}  {back}")
        if e.get("restoreReason"):
            lines.append(f"      restore failed: {e['restoreReason']}")
        if e.get("restoreSeconds") is not None and e.get("restoreStartedAt") is not None:
            waited = float(e["restoreStartedAt"]) - float(e["at"])
            node = "" if e.get("waitingSeconds") is None else \
                f"on a node after {_secs(e['waitingSeconds'])}, "
            lines.append(f"      replacement pod {node}restoring after {_secs(max(0.0, waited))}, "
                         f"restore {_secs(e['restoreSeconds'])}")
    return "\n".join(lines) + "\n"
