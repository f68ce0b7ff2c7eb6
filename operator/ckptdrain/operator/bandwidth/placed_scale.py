"""The cluster scale factor placed in a namespace, as the apiserver holds it:
what a process that has not written the scale itself (a restart, a replica
that took over the lease, a new release) must not raise before the channels
written under it are rewritten (bandwidth/share_channel.py `publish_scale`).
"""

from __future__ import annotations

import math

from ckptdrain.contract import share as sh
from ckptdrain.operator.apiserver import kube

#: Placed factor when no scale object exists: agents then apply their
#: channel's budget alone, so any factor writes a cut, never a raise.
NONE_PLACED = math.inf


def placed_factor(namespace: str) -> float | None:
    """The factor `namespace`'s scale object holds, NONE_PLACED without one;
    None where it cannot be told (the read failed, or the object is
    malformed): then no factor may be written that could raise it."""
    try:
        obj = kube.read_own(sh.SHARES, namespace, sh.SCALE_NAME)
        return NONE_PLACED if obj is None else sh.scale_from_object(obj).factor
    except Exception:  # unknown: the caller holds back, and retries later
        return None
