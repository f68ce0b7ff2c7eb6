"""Where an injected pod may run, as JSONPatch ops: its policy's node
requirements and tolerations, and its class's nodeSelector and
tolerations (policy/class_placement.py). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptdrain.operator.admission.patch import JSONPatch, append, pointer
from ckptdrain.operator.policy import class_placement
from ckptdrain.operator.policy.class_placement import ANYWHERE, Placement
from ckptdrain.operator.policy.spec import Policy


def placement_ops(spec: Mapping[str, Any], policy: Policy,
                  placement: Placement = ANYWHERE) -> JSONPatch:
    """The policy's node requirements ANDed into every required node-selector
    term the pod already has (or one new term); the class's nodeSelector
    merged into the pod's; the class's and the policy's tolerations added."""
    ops: JSONPatch = []
    selector = class_placement.selector_additions(spec, placement)
    if selector and spec.get("nodeSelector") is None:
        ops.append({"op": "add", "path": "/spec/nodeSelector", "value": selector})
    else:
        ops.extend({"op": "add", "path": f"/spec/nodeSelector/{pointer(k)}", "value": v}
                   for k, v in selector.items())
    if policy.node_expressions:
        affinity = dict(spec.get("affinity") or {})
        node = dict(affinity.get("nodeAffinity") or {})
        required = dict(node.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
        own = [dict(t) for t in required.get("nodeSelectorTerms") or []]
        terms = own or [{}]
        for term in terms:
            # An empty term of the pod's matches no node; ANDing into it
            # would make one that matches, and widen where the pod may run.
            if own and not (term.get("matchExpressions") or term.get("matchFields")):
                continue
            term["matchExpressions"] = [*(term.get("matchExpressions") or []),
                                        *policy.node_expressions]
        required["nodeSelectorTerms"] = terms
        node["requiredDuringSchedulingIgnoredDuringExecution"] = required
        affinity["nodeAffinity"] = node
        # "add" on an existing member replaces it: the merged affinity is whole.
        ops.append({"op": "add", "path": "/spec/affinity", "value": affinity})
    have = spec.get("tolerations")
    append(ops, "/spec/tolerations", have, class_placement.tolerations_to_add(
        have, [*placement.tolerations, *policy.tolerations]))
    return ops
