"""The namespace labels the joint budgets (bandwidth/rebalance.py) parse
their policies with, read before the budgets' locks.

A class that allows namespaces by label judges a policy by its namespace's
labels (policy/class_namespaces.py). The budgets parse every policy under
their memo's lock, and a pass holds its own lock (the joint pass's, or a
policy's) around them: one read there (3 s while the apiserver times out,
per namespace) would stall every rebalance and reconcile waiting for a
budget. So `read` runs first, outside those locks, and the parse under
them takes what is held (`namespace_labels.held`).

`read` asks `namespace_labels.recent` for each namespace that needs labels:
a reading younger than MAX_AGE_S is taken as it is; a missing or older one
is read now, and a failed read is remembered, so a slow apiserver costs at
most one timeout per namespace per FAILURE_MEMORY_S. The budgets cannot
wait for each policy's own reconcile or the recheck to have read: after a
start or a new term no reading is held, and the first policy reconciled
would take the whole cluster cap while the others' drainers wait; and a
recheck cut short by its time budget may leave readings to grow old.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from ckptdrain.operator.apiserver import class_view, namespace_labels
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import classes

Key = tuple[str, str]


def needing_labels(policies: kopf.Index[Key, Any] | Mapping[Key, Any],
                   catalogue: classes.Catalogue) -> list[str]:
    """The namespaces (sorted) of the policies whose class allows
    namespaces by label."""
    found: set[str] = set()
    for key in list(policies):
        body = next((b for b in policies.get(key, []) if b is not None), None)
        if key[0] and key[0] not in found and body is not None \
                and classes.needs_labels(body.get("spec") or {}, catalogue):
            found.add(key[0])
    return sorted(found)


def read(cfg: OperatorConfig, policies: kopf.Index[Key, Any] | Mapping[Key, Any],
         catalogue: classes.Catalogue | None = None) -> None:
    """The labels each policy's namespace needs held, where they can be
    read: a namespace that cannot is left to the parse, which gives its
    policies no share (LabelsUnreadable) until a later pass reads it."""
    catalogue = class_view.current(classes.catalogue) if catalogue is None else catalogue
    for namespace in needing_labels(policies, catalogue):
        try:
            namespace_labels.recent(namespace, cfg.namespace_recheck_s)
        except namespace_labels.LabelsUnreadable:
            continue
