"""The sizing model: how big a checkpoint is, how fast it must drain, and
how that bandwidth is shared among the nodes that drain it.

    checkpoint_bytes   = parameters × bytes_per_parameter
    required_bandwidth = checkpoint_bytes / (global_interval × overlap)

where global_interval = local interval × global_every.

The expected goodput follows what restore does (restore/): ranks agree on
the newest step every rank can get from some tier. An interruption that
leaves every node intact restores the newest local step; one that loses a
node restores the newest step that node's writer can still get: its peer
copy with the peer tier on (local cadence, one replication later), else the
newest global step. On average half the interval of the tier restored from
is lost, plus the time that tier's copy trails the local one.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ckptdrain.errors import InvalidInput

#: Mixed precision with Adam: fp32 master weights (4) + two moments (8) + bf16 weights (2).
DEFAULT_BYTES_PER_PARAMETER = 14.0
#: A sensible checkpoint interval is about a tenth of the mean time to interruption.
DEFAULT_INTERVAL_FRACTION_OF_MTTI = 0.1
#: Keep the global drain busy for at most a tenth of the interval.
DEFAULT_OVERLAP = 0.1
#: Share of interruptions that lose the whole node (and so its local copy).
DEFAULT_NODE_LOSS_FRACTION = 0.05


@dataclass(frozen=True)
class SizingInput:
    """What a policy says about the workload. Give parameters or checkpoint_bytes,
    and interval or mtti (interval wins when both are given)."""

    parameters: float | None = None
    bytes_per_parameter: float = DEFAULT_BYTES_PER_PARAMETER
    checkpoint_bytes: float | None = None
    interval_s: float | None = None
    mtti_s: float | None = None
    overlap: float = DEFAULT_OVERLAP
    global_every: int = 1
    #: C: seconds one checkpoint stalls training (the local write). Enables Young–Daly.
    local_write_s: float | None = None
    #: Seconds from interruption to training again (reschedule + restore).
    restart_s: float | None = None
    #: Bandwidth caps in bytes/s (policy and cluster); None means no cap.
    policy_cap: float | None = None
    cluster_cap: float | None = None
    drainers: int = 1
    node_loss_fraction: float = DEFAULT_NODE_LOSS_FRACTION
    #: spec.peerTier.enabled: a node loss restores from the partner's copy.
    peer_tier: bool = False


@dataclass(frozen=True)
class Sizing:
    checkpoint_bytes: float
    local_interval_s: float
    global_interval_s: float
    overlap: float
    required_bandwidth: float
    allowed_bandwidth: float
    bandwidth_constrained: bool
    #: Which cap bound, "policy" or "cluster", or None.
    binding_cap: str | None
    #: Drain time ÷ global interval at the allowed bandwidth.
    effective_overlap: float
    drain_seconds: float
    drainers: int
    per_drainer_bandwidth: float
    recommended_interval_s: float | None
    young_daly_interval_s: float | None
    #: Expected fraction of wall time doing useful work; None without MTTI.
    goodput: float | None
    #: Mean work lost per interruption (None without MTTI), and its two cases.
    lost_work_per_interruption_s: float | None
    node_loss_fraction: float
    #: Every node intact: the newest local step is restored.
    lost_work_node_intact_s: float
    #: A node lost: its writer's peer copy ("peer") or the global step ("global").
    node_loss_restores_from: str
    lost_work_node_lost_s: float


def _positive(field: str, value: float | None, expected: str) -> float:
    if value is None or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise InvalidInput(field, expected, value)
    return float(value)


def checkpoint_size(inp: SizingInput) -> float:
    """Bytes in one checkpoint: given directly, or parameters × bytes per parameter."""
    if inp.checkpoint_bytes is not None:
        return _positive("checkpointBytes", inp.checkpoint_bytes, "a positive size in bytes")
    if inp.parameters is None:
        raise InvalidInput("model", "parameters or checkpointBytes", None)
    params = _positive("parameters", inp.parameters, "a positive parameter count")
    per = _positive("bytesPerParameter", inp.bytes_per_parameter, "a positive number such as 14")
    if not math.isfinite(params * per):  # 1e308 parameters: each factor finite, not the product
        raise InvalidInput("parameters", "a parameter count whose checkpoint size "
                           "(parameters × bytes per parameter) is a finite number", params)
    return params * per


def young_daly_interval(local_write_s: float, mtti_s: float) -> float:
    """The Young–Daly optimum sqrt(2 × C × MTTI)."""
    return math.sqrt(2.0 * local_write_s * mtti_s)


def peer_bandwidth(checkpoint_bytes: float, local_interval_s: float, overlap: float,
                   writers: int = 1) -> float:
    """Bytes/s each writer replicates to its partner (docs/peer-tier.md): the
    sizing model with the *local* interval, each writer sending its share of
    the checkpoint within `overlap` of the local interval."""
    size = _positive("checkpointBytes", checkpoint_bytes, "a positive size")
    interval = _positive("interval", local_interval_s, "a positive duration such as 15m")
    if not (isinstance(overlap, int | float) and 0 < overlap <= 1):
        raise InvalidInput("overlap", "a fraction in (0, 1] such as 10%", overlap)
    if isinstance(writers, bool) or not isinstance(writers, int) or writers < 1:
        raise InvalidInput("writers", "a whole number >= 1", writers)
    return size / writers / (interval * overlap)


def lost_work(local_interval_s: float, global_interval_s: float, drain_s: float,
              overlap: float, peer_tier: bool) -> tuple[float, str, float]:
    """(mean work lost with every node intact, the tier a node loss restores
    from, mean work lost then). Intact: half a local interval. A node lost:
    half a local interval plus the replication (`overlap` of it, the peer
    tier's bandwidth) from the partner's copy; without the peer tier, half a
    global interval plus the drain time, since the global copy is that much
    older than the local one it drained."""
    intact = local_interval_s / 2
    if peer_tier:
        return intact, "peer", intact + local_interval_s * overlap
    return intact, "global", global_interval_s / 2 + drain_s


def compute(inp: SizingInput) -> Sizing:
    """Apply the sizing model, caps included. Raises InvalidInput naming the field."""
    size = checkpoint_size(inp)
    overlap = inp.overlap
    if not (isinstance(overlap, int | float) and 0 < overlap <= 1):
        raise InvalidInput("overlap", "a fraction in (0, 1] such as 10%", overlap)
    if isinstance(inp.global_every, bool) or not isinstance(inp.global_every, int) \
            or inp.global_every < 1:
        raise InvalidInput("globalEvery", "a whole number >= 1", inp.global_every)
    if isinstance(inp.drainers, bool) or not isinstance(inp.drainers, int) or inp.drainers < 1:
        raise InvalidInput("drainers", "a whole number >= 1", inp.drainers)

    mtti = None if inp.mtti_s is None else _positive("mtti", inp.mtti_s, "a positive duration")
    recommended = None if mtti is None else mtti * DEFAULT_INTERVAL_FRACTION_OF_MTTI
    if inp.interval_s is not None:
        interval = _positive("interval", inp.interval_s, "a positive duration such as 15m")
    elif recommended is not None:
        interval = recommended
    else:
        raise InvalidInput("interval", "interval or mtti", None)

    write_s = None if inp.local_write_s is None else _positive(
        "localWriteSeconds", inp.local_write_s, "a positive duration")
    young_daly = None if (write_s is None or mtti is None) else young_daly_interval(write_s, mtti)

    global_interval = interval * inp.global_every
    if not math.isfinite(global_interval):
        raise InvalidInput("interval", "a duration whose product with globalEvery is finite",
                           interval)
    required = size / (global_interval * overlap)

    caps = {
        name: _positive(f"caps.{name}", value, "a positive rate such as 10GB/s")
        for name, value in (("policy", inp.policy_cap), ("cluster", inp.cluster_cap))
        if value is not None
    }
    allowed, binding = required, None
    for name, cap in caps.items():
        if cap < allowed:
            allowed, binding = cap, name
    if allowed <= 0 or not math.isfinite(size / allowed):  # extreme inputs under/overflow
        raise InvalidInput(f"caps.{binding}" if binding else "interval",
                           "values at which the checkpoint drains in a finite time", allowed)
    drain_seconds = size / allowed

    loss = inp.node_loss_fraction
    if isinstance(loss, bool) or not isinstance(loss, int | float) or not 0 <= loss <= 1:
        raise InvalidInput("nodeLossFraction", "a fraction in [0, 1] such as 5%", loss)
    intact, lost_tier, node_lost = lost_work(interval, global_interval, drain_seconds,
                                             overlap, inp.peer_tier)
    goodput = lost = None
    if mtti is not None:
        lost = (1 - loss) * intact + loss * node_lost
        restart = inp.restart_s or 0.0
        stall = (write_s or 0.0) / interval
        goodput = max(0.0, 1.0 - stall - (lost + restart) / mtti)

    return Sizing(
        checkpoint_bytes=size,
        local_interval_s=interval,
        global_interval_s=global_interval,
        overlap=overlap,
        required_bandwidth=required,
        allowed_bandwidth=allowed,
        bandwidth_constrained=binding is not None,
        binding_cap=binding,
        effective_overlap=drain_seconds / global_interval,
        drain_seconds=drain_seconds,
        drainers=inp.drainers,
        per_drainer_bandwidth=allowed / inp.drainers,
        recommended_interval_s=recommended,
        young_daly_interval_s=young_daly,
        goodput=goodput,
        lost_work_per_interruption_s=lost,
        node_loss_fraction=loss,
        lost_work_node_intact_s=intact,
        node_loss_restores_from=lost_tier,
        lost_work_node_lost_s=node_lost,
    )


