"""A policy parsed under its class's settings, and its ClassResolved
condition: what every bandwidth pass reads a policy's body with."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from ckptdrain.operator.apiserver import class_view, namespace_labels
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import classes
from ckptdrain.operator.policy import spec as pol


def parse_policy(cfg: OperatorConfig, body: dict[str, Any], drainers: int,
                 catalogue: classes.Catalogue | None = None,
                 read_labels: bool = True) -> pol.Policy:
    """The policy under its class's settings (policy/classes.py; the
    classes now unless `catalogue`); raises InvalidInput (ClassUnresolved
    when its class does not take it; LabelsUnreadable when its namespace's
    labels are needed and neither held nor, with `read_labels`, readable)."""
    meta = body.get("metadata", {})
    namespace = meta.get("namespace", "")
    catalogue = class_view.current(classes.catalogue) if catalogue is None else catalogue
    labels = namespace_labels.recent if read_labels else namespace_labels.held
    resolution = classes.resolved(namespace, body.get("spec", {}), cfg, catalogue,
                                  partial(labels, namespace, cfg.namespace_recheck_s))
    return pol.parse(namespace, meta.get("name", ""), resolution.spec, resolution.config,
                     drainers=max(1, drainers))


def class_condition(cfg: OperatorConfig, body: Mapping[str, Any]) -> dict[str, str]:
    """The policy's ClassResolved condition (type, status, reason, message);
    raises namespace_labels.LabelsUnreadable when it cannot be told."""
    namespace = (body.get("metadata") or {}).get("namespace", "")
    labels = partial(namespace_labels.recent, namespace, cfg.namespace_recheck_s)
    return classes.condition(classes.resolve(namespace, body.get("spec") or {}, cfg,
                                             class_view.current(classes.catalogue), labels))
