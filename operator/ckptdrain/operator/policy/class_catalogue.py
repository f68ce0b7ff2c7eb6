"""Judgements over all the CheckpointClasses at once: each class's own
conditions (Accepted; Default for a class annotated default, False for all
but the oldest), each policy's weight under the cluster cap where its
class sets one, and its class's cap on its policies together. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckptdrain.operator.policy.class_shares import ClassCap
from ckptdrain.operator.policy.classes import (
    Catalogue,
    CheckpointClass,
    ClassInvalid,
    choose,
    default_choice,
)


def weights(bodies: Mapping[tuple[str, str], Mapping[str, Any]], classes: Catalogue
            ) -> dict[tuple[str, str], int]:
    """Each policy's weight under the cluster cap where its class sets one
    (spec.bandwidthWeight, in place of its namespace's), by (namespace, name)."""
    out = {}
    for key, body in bodies.items():
        cls = choose(body.get("spec") or {}, classes).cls
        if isinstance(cls, CheckpointClass) and cls.bandwidth_weight is not None:
            out[key] = cls.bandwidth_weight
    return out


def caps(bodies: Mapping[tuple[str, str], Mapping[str, Any]], classes: Catalogue
         ) -> dict[tuple[str, str], ClassCap]:
    """Each policy's class cap where its class sets one (spec.bandwidthCap:
    the most the class's policies drain at together), by (namespace, name)."""
    out = {}
    for key, body in bodies.items():
        cls = choose(body.get("spec") or {}, classes).cls
        if isinstance(cls, CheckpointClass) and cls.bandwidth_cap is not None:
            out[key] = ClassCap(cls.name, cls.bandwidth_cap)
    return out


def bandwidth_settings(classes: Catalogue) -> dict[str, tuple[int | None, float | None]]:
    """Each usable class's (weight, cap): what the joint split reads of it,
    so that an edit of either asks for a joint pass (class_events.py)."""
    return {name: (cls.bandwidth_weight, cls.bandwidth_cap) for name, cls in classes.items()
            if isinstance(cls, CheckpointClass)}


#: A class's own conditions: whether the operator can use it, and (for a
#: class annotated default) whether it is the default.
ACCEPTED, DEFAULT = "Accepted", "Default"


def class_conditions(classes: Catalogue) -> dict[str, list[dict[str, str]]]:
    """Each class's own conditions (type, status, reason, message), by name:
    Accepted, and Default where annotated so (False for all but the oldest,
    which names them)."""
    out: dict[str, list[dict[str, str]]] = {}
    for name, cls in classes.items():
        if isinstance(cls, ClassInvalid):
            out[name] = [{"type": ACCEPTED, "status": "False", "reason": "Invalid",
                          "message": "; ".join(str(e) for e in cls.errors)}]
        else:
            out[name] = [{"type": ACCEPTED, "status": "True", "reason": "Valid", "message": ""}]
    winner = default_choice(classes)
    message = winner.warning or "policies that name no class get this one"
    if isinstance(winner.cls, CheckpointClass) and winner.cls.namespaces.restricted:
        # Per namespace the default is the oldest default that allows it:
        # elsewhere another one (or none) is, whatever this condition says.
        message += (f"; only in namespaces its spec.namespaces.selector matches "
                    f"({winner.cls.namespaces.describe()}): elsewhere the oldest default "
                    "class that allows the namespace, or none")
    for name, cls in classes.items():
        if not cls.default:
            continue
        won = winner.cls is cls
        out[name].append({
            "type": DEFAULT, "status": "True" if won else "False",
            "reason": ("Default" if not winner.warning else "OldestDefault") if won
            else "NewerDefault",
            "message": message})
    return out
