"""Why a policy gets the bandwidth it gets: the BandwidthConstrained
condition's verdict (status, reason, message), from its sizing under the
joint budget and its part of the cluster cap and its class's cap
(operator/policy/allocation.py). Pure; policy/status.py writes it.

Reasons: WithinCaps (False), PolicyCap (its own caps.bandwidth),
ClusterCap (the cluster cap, split fairly), ClassCap (its CheckpointClass's
spec.bandwidthCap, split fairly among the class's policies).
"""

from __future__ import annotations

from ckptdrain import units
from ckptdrain.operator.policy.allocation import ClusterShare
from ckptdrain.operator.policy.class_shares import ClassPart
from ckptdrain.sizing import Sizing

WITHIN, POLICY_CAP, CLUSTER_CAP, CLASS_CAP = "WithinCaps", "PolicyCap", "ClusterCap", "ClassCap"

#: What an idle policy's BandwidthConstrained adds: its figures are what it
#: gets once it runs, and until then it takes nothing from the others.
IDLE_NOTE = ("; no pod of it runs, so it takes no part of the cluster cap yet: "
             "these are its figures once one does")
#: The same under a class cap (with or without a cluster cap).
IDLE_CLASS_NOTE = ("; no pod of it runs, so it takes no part of its class's cap yet: "
                   "these are its figures once one does")


def verdict(s: Sizing, cluster: ClusterShare | None) -> tuple[bool, str, str]:
    """(constrained, reason, message): a policy a cap cut says which, by how
    much, and what its fair part is."""
    if not s.bandwidth_constrained:
        return (False, WITHIN, f"{units.format_rate(s.required_bandwidth)} fits every cap"
                + _idle_note(cluster, WITHIN))
    cap, reason = f"the {s.binding_cap} cap", CLUSTER_CAP
    if s.binding_cap == "policy":
        reason = POLICY_CAP
    elif cluster is not None and cluster.class_bound and cluster.class_part is not None:
        cap, reason = _class_part(cluster, cluster.class_part), CLASS_CAP
    elif cluster is not None and cluster.cluster_cap is not None:
        cap = _fair_part(cluster)
    note = _idle_note(cluster, reason)
    return (True, reason,
            f"{cap} allows {units.format_rate(s.allowed_bandwidth)} of the "
            f"{units.format_rate(s.required_bandwidth)} required: effective overlap "
            f"{units.format_percent(s.effective_overlap)} instead of "
            f"{units.format_percent(s.overlap)}" + note)


def _idle_note(cluster: ClusterShare | None, reason: str) -> str:
    """An idle policy's note, of the cap that cuts it (its class's unless
    the cluster's does, or no cap does and its class has none)."""
    if cluster is None or cluster.counted:
        return ""
    if cluster.class_part is not None and reason != CLUSTER_CAP:
        return IDLE_CLASS_NOTE
    return IDLE_NOTE if cluster.cluster_cap is not None else ""


def _fair_part(c: ClusterShare) -> str:
    """Why the cluster cap gives a policy what it gives: whom it shares with
    and by which weights (operator/policy/fair_share.py)."""
    cap = f"the cluster cap of {units.format_rate(c.cluster_cap or 0.0)}"
    others = c.policies - (1 if c.counted else 0)
    if others <= 0:
        return cap
    # The others at what their classes' caps leave them (its own class's
    # cap does not cut it: the cluster's cuts harder).
    capped = c.total_capped is not None
    total = c.total_capped if c.total_capped is not None else c.total_wanted
    own = c.wanted_in_class if capped and c.wanted_in_class is not None else c.wanted
    others_want = total - (own if c.counted else 0.0)
    weights = c.total_weight + (0 if c.counted else c.weight)
    split = "equal weights" if weights == others + 1 else f"weight {c.weight} of {weights}"
    return (f"{cap}, split fairly ({split}) with {others} other "
            f"{'policy' if others == 1 else 'policies'} with pods wanting "
            f"{units.format_rate(max(others_want, 0.0))} together"
            + (" once their classes' caps cut them" if capped else "") + ",")


def _class_part(c: ClusterShare, part: ClassPart) -> str:
    """Why its class's cap gives a policy what it gives: the class, its cap,
    and the class's other policies with pods."""
    cap = (f"the cap of CheckpointClass {part.name} (spec.bandwidthCap "
           f"{units.format_rate(part.cap)}, for its policies together)")
    others = part.policies - 1
    if others <= 0:
        return cap
    others_want = part.total_wanted - c.wanted
    split = "equal weights" if part.total_weight == others + 1 \
        else f"weight {c.weight} of {part.total_weight}"
    return (f"{cap}, split fairly ({split}) with {others} other "
            f"{'policy' if others == 1 else 'policies'} of the class with pods wanting "
            f"{units.format_rate(max(others_want, 0.0))} together,")
