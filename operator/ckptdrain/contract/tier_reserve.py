"""How many steps a writer's local tier keeps free beyond those it keeps:
the agent sizes its evictions by it (node/space.py) and policy admission
its warning of a node without room for one writer (operator/admission/
node_room.py), so the two sides share this one rule."""

from __future__ import annotations


def reserve_steps(need: int, capacity: int | None, keep: int, work_on_disk: bool) -> int:
    """How many steps of `need` bytes a scheduled capture keeps free: the
    SIGTERM capture's, and with the trainer's work dir on the tier's disk its
    next save's too, but only where `capacity` holds `keep + 3` such steps
    (docs/pod-contract.md). Admission accepts a capacity of `keep + 1`
    shards: two steps kept free there would refuse every scheduled capture,
    and never capturing is worse than a SIGTERM capture that may not fit. Pure."""
    if not work_on_disk:
        return 1
    return 2 if capacity is None or capacity >= (keep + 3) * need else 1
