"""policy/roles.py: which pods write, which only read, and which are refused."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.operator.policy.identity import Identity
from ckptdrain.operator.policy.roles import Role, RoleRefused, assign


def pod(role: str | None = None) -> dict[str, Any]:
    notes = {} if role is None else {"ckptdrain.io/role": role}
    return {"metadata": {"name": "p", "annotations": notes}}


def job(rank: int | None, pods: int | None = None) -> Identity:
    return Identity("Job", rank, pods, f"index={rank}")


@given(rank=st.integers(0, 10_000), writers=st.integers(1, 512))
def test_replicas_read_the_shard_their_rank_wraps_to(rank: int, writers: int) -> None:
    role = assign(pod(), job(rank), writers, "Replicas")
    assert role.reader == (rank >= writers)
    assert role.shard == rank % writers


@given(rank=st.integers(0, 10_000), writers=st.integers(1, 512))
def test_without_replicas_only_a_declared_reader_may_rank_past_writers(
        rank: int, writers: int) -> None:
    if rank >= writers:
        with pytest.raises(RoleRefused, match=r"is not below spec\.writers"):
            assign(pod(), job(rank), writers, "Declared")
    else:
        assert assign(pod(), job(rank), writers, "Declared") == Role(False, rank, False)
    declared = assign(pod("reader"), job(rank), writers, "Declared")
    assert (declared.reader, declared.shard) == (True, rank % writers)


def test_a_reader_of_one_writer_needs_no_rank() -> None:
    assert assign(pod("reader"), None, 1, "Declared") == Role(True, 0, True)
    assert assign(pod(), None, 1, "Replicas") == Role(False, None, False)


def test_writers_learn_whether_readers_restore_beside_them() -> None:
    # The workload says how many pods it runs: more than writers means replicas.
    assert assign(pod(), job(0, 2), 1, "Replicas").readers_alongside
    assert not assign(pod(), job(0, 1), 1, "Replicas").readers_alongside
    # Size unknown, ranked: replicas may run, and a split job is worse than a
    # global-only restore.
    assert assign(pod(), job(0, None), 1, "Replicas").readers_alongside
    # Readers only by declaration: the writers' own workload has none.
    assert not assign(pod(), job(0, 2), 1, "Declared").readers_alongside


def test_the_workload_count_is_checked_as_replicas_of_writers() -> None:
    two = assign(pod(), job(0, 8), 4, "Replicas")
    assert (two.workload_writers, two.warning) == (4, None)
    ragged = assign(pod(), job(0, 6), 4, "Replicas")
    assert ragged.workload_writers == 6
    assert ragged.warning is not None and "6 pods, not a whole number" in ragged.warning
    fewer = assign(pod(), job(0, 3), 4, "Replicas")
    assert fewer.warning == "spec.writers is 4 but the Job has 3 pods that write"
    assert assign(pod(), job(0, 8), 4, "Declared").warning == (
        "spec.writers is 4 but the Job has 8 pods that write")


def test_a_declared_writer_must_hold_a_writer_rank() -> None:
    assert assign(pod("writer"), job(3), 4, "Replicas").shard == 3
    with pytest.raises(RoleRefused, match=r"declares ckptdrain\.io/role: writer"):
        assign(pod("writer"), job(4), 4, "Replicas")
    with pytest.raises(RoleRefused, match="expected 'writer' or 'reader', got 'both'"):
        assign(pod("both"), job(0), 4, "Replicas")


# -- the spec fields: spec.readers and spec.restore.reshard ---------------------------


def _spec(**over: Any) -> dict[str, Any]:
    return {"selector": {"matchLabels": {"app": "t"}}, "model": {"checkpointBytes": "8GB"},
            "interval": "15m", "writers": 4, "localTier": {"path": "/mnt/ckptdrain/n"},
            "storage": {"uri": "s3://bucket/runs"}, **over}


def test_readers_and_reshard_are_read_and_reach_restore() -> None:
    from ckptdrain.node import config as node_config
    from ckptdrain.operator import config
    from ckptdrain.operator.admission import pod_env
    from ckptdrain.operator.policy import spec as policy

    cfg = config.OperatorConfig(allowed_root="/mnt/ckptdrain")
    default = policy.parse("ml", "p", _spec(), cfg)
    assert (default.readers, default.restore_reshard) == ("Declared", "DCP")
    p = policy.parse("ml", "p", _spec(readers="Replicas", restore={"reshard": "Trainer"}), cfg)
    assert (p.readers, p.restore_reshard) == ("Replicas", "Trainer")
    env = pod_env.agent_env({"spec": {}}, p, 1e9, rank=0)
    agent = node_config.load(environ={e["name"]: e["value"] for e in env if "value" in e})
    assert agent.restore_reshard == "trainer"
    problems = [str(e) for e in policy.validate(_spec(readers="replicas",
                                                      restore={"reshard": "dcp"}), cfg)]
    assert any(e.startswith("spec.readers: expected") for e in problems), problems
    assert any(e.startswith("spec.restore.reshard: expected") for e in problems), problems


def test_the_crd_offers_what_the_operator_reads() -> None:
    from pathlib import Path

    import yaml

    from ckptdrain.operator.policy import spec as policy

    crd = yaml.safe_load((Path(__file__).resolve().parents[3] / "crds" /
                          "checkpointpolicies.yaml").read_text())
    assert len(crd["spec"]["versions"]) >= 2
    for version in crd["spec"]["versions"]:  # every served version offers the same
        props = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        assert (props["readers"]["enum"], props["readers"]["default"]) == (
            list(policy.READERS), "Declared"), version["name"]
        reshard = props["restore"]["properties"]["reshard"]
        assert (reshard["enum"], reshard["default"]) == (list(policy.RESHARD), "DCP")
