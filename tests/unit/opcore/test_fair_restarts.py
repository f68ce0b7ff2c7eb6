"""The cluster cap holds when a fresh process (a restart, a replica that
took over the lease, a new release) takes over channels and scales it did
not write: it knows no factor it placed, so it raises none before every
channel it may raise is rewritten. The cluster harness of
test_fair_transitions.py: after every write, what the agents would apply
adds up to no more than the cap."""

from __future__ import annotations

from tests.unit.opcore.test_fair_channel_state import classed, klass
from tests.unit.opcore.test_fair_transitions import (  # noqa: F401 (the cluster fixture)
    CAP,
    Cluster,
    cfg_of,
    cluster_fixture,
    fresh_process,
    pod,
)

from ckptdrain.contract import share as sh
from ckptdrain.operator.apiserver import class_view
from ckptdrain.operator.bandwidth import rebalance
from ckptdrain.operator.config import OperatorConfig
from ckptdrain.operator.policy import allocation


def _light_and_gold(cluster: Cluster, classes: class_view.ClassView) -> OperatorConfig:
    """Namespace a: LIGHT (weight 1) and GOLD (weight 3) draining; b: B."""
    classes.replace([klass("gold", weight=3)], "1")
    cfg = cfg_of()
    cluster.policies = {("a", "LIGHT"): [classed("a", "LIGHT", None)],
                        ("a", "GOLD"): [classed("a", "GOLD", "gold")],
                        ("b", "B"): [classed("b", "B", None)]}
    cluster.pods = {("a", "LIGHT"): [pod("LIGHT-0")], ("a", "GOLD"): [pod("GOLD-0")],
                    ("b", "B"): [pod("B-0")]}
    cluster.settle(cfg)
    return cfg


def test_a_fresh_process_raises_no_factor_over_an_older_releases_channels(
        cluster: Cluster, no_checkpoint_classes: class_view.ClassView) -> None:
    cfg = _light_and_gold(cluster, no_checkpoint_classes)
    # What the release before left: every channel claiming the whole CLAIM,
    # its namespace's factor its smallest policy's (LIGHT's, 20 MB/s), and
    # LIGHT's budget stale from when it drained alone (the factor cut it).
    light = cluster.objects[("a", "LIGHT")]["spec"]
    light["wantedBytes"], light["budgetBytes"] = int(allocation.CLAIM), int(90e6)
    cluster.objects[("a", "GOLD")]["spec"].pop("wantedBytes", None)
    cluster.objects[("a", sh.SCALE_NAME)]["spec"]["clusterScale"]["factor"] = \
        20e6 / allocation.CLAIM
    assert sum(cluster.applied().values()) <= CAP * 1.000001
    fresh_process()
    cluster.worst = 0
    cluster.joint(cfg)
    assert cluster.worst <= CAP * 1.000001
    cluster.settle(cfg)
    assert cluster.worst <= CAP * 1.000001
    assert cluster.applied()[("a", "GOLD")] == 60e6  # and GOLD gets its part


def test_a_fresh_process_over_its_own_releases_channels_keeps_the_cap(
        cluster: Cluster, no_checkpoint_classes: class_view.ClassView) -> None:
    cfg = _light_and_gold(cluster, no_checkpoint_classes)
    for i in range(3):  # more namespaces join, each moving every factor
        key = (f"c{i}", "C")
        cluster.policies[key] = [classed(*key, None)]
        rebalance.changes.seen(key, cluster.policies[key][0])
        cluster.pods[key] = [pod(f"C{i}-0")]
        cluster.pass_of(cfg, key)
        cluster.now += 1.01
        cluster.settle(cfg)
    cluster.worst = 0
    fresh_process()
    cluster.pass_of(cfg, ("a", "LIGHT"))  # its own pass before any joint one
    cluster.settle(cfg)
    assert cluster.worst <= CAP * 1.000001
