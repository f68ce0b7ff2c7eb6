"""agent/stale_work.py and its use by the agent loop: work dirs earlier pods of
this writer left on the node go once this pod holds the writer's lease, never
this pod's own or another writer's; with the work dir on the node the tier
keeps room for the trainer's next save as well as the SIGTERM capture."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.asuser import CKPTDRAIN_UID, GROUP, need_root, run_as

from ckptdrain.agent import stale_work
from ckptdrain.agent.loop import Agent
from ckptdrain.agent.metrics import AgentMetrics
from ckptdrain.client import Client
from ckptdrain.node import config
from ckptdrain.node.localtier import LocalTier

OWN = "work-3-5f0c1b2a-9d3e-4c1f-8a7b-0e1d2c3b4a59"
OLD = "work-3-0a1b2c3d-0000-4c1f-8a7b-0e1d2c3b4a59"
OLDER = "work-3-ffffffff-1111-4c1f-8a7b-0e1d2c3b4a59"
OTHER_WRITER = "work-31-0a1b2c3d-0000-4c1f-8a7b-0e1d2c3b4a59"
NEWER = "work-3-9e8d7c6b-2222-4c1f-8a7b-0e1d2c3b4a59"


def test_only_this_writers_other_pod_dirs_are_stale() -> None:
    names = [OWN, OLD, OLDER, OTHER_WRITER, "work-30-abc", "writer-3", "step-7", "work",
             "work-3", "work-3-", "work-3-XYZ", "work-3-abc/..", "work-03-abc"]
    assert stale_work.stale(OWN, names) == sorted([OLD, OLDER])
    assert stale_work.stale("work-31-abc", names) == [OTHER_WRITER]


def test_a_work_dir_that_is_not_a_pods_has_nothing_stale() -> None:
    assert stale_work.stale("work", [OLD, OLDER]) == []
    assert stale_work.stale("work-3", [OLD, OLDER]) == []


def test_the_work_dir_is_on_the_node_only_at_the_local_tiers_volume_root(tmp_path: Path) -> None:
    node = tmp_path / "node"
    (node / OWN).mkdir(parents=True)
    assert stale_work.volume_root(node / OWN, node) == node  # one writer
    assert stale_work.volume_root(node / OWN, node / "writer-3") == node  # several, not made yet
    assert stale_work.volume_root(tmp_path / "work", tmp_path / "local") is None  # an emptyDir
    assert stale_work.volume_root(node / "deeper" / OWN, node) is None
    assert stale_work.volume_root(tmp_path / OWN, node / "writer-3") is None


@pytest.fixture
def node() -> Iterator[Path]:
    need_root()
    top = Path(tempfile.mkdtemp(prefix="ckptdrain-stale-"))
    os.chmod(top, 0o755)
    node = top / "node"
    node.mkdir()
    os.chown(node, CKPTDRAIN_UID, CKPTDRAIN_UID)
    os.chmod(node, 0o700)
    yield node
    shutil.rmtree(top)


def _work(node: Path, name: str) -> Path:
    """A pod's work dir as prepare leaves it, with a step in it."""
    work = node / name
    (work / "step-1").mkdir(parents=True)
    (work / "step-1" / "w.bin").write_bytes(b"x" * 100)
    for path in (work, work / "step-1", work / "step-1" / "w.bin"):
        os.chown(path, CKPTDRAIN_UID, GROUP)
    os.chmod(work, 0o2775)
    os.chmod(work / "step-1", 0o2775)
    return work


def test_removal_spares_its_own_and_other_writers_and_follows_no_symlink(node: Path) -> None:
    for name in (OWN, OLD, OTHER_WRITER):
        _work(node, name)
    outside = node.parent / "outside"
    (outside / "keep").mkdir(parents=True)
    (node / OLDER).symlink_to(outside)  # planted: removed as a link, never entered
    (node / OLD / "escape").symlink_to(outside)

    def prune() -> tuple[list[str], int]:
        failed: list[int] = []
        gone = stale_work.StaleWork(node, node / OWN, lambda: failed.append(1)).prune()
        return gone, len(failed)

    gone, failed = run_as(CKPTDRAIN_UID, prune)
    assert sorted(gone) == sorted([OLD, OLDER]) and failed == 0
    assert sorted(os.listdir(node)) == sorted([OWN, OTHER_WRITER])
    assert (node / OWN / "step-1" / "w.bin").exists()
    assert (node / OTHER_WRITER / "step-1" / "w.bin").exists()
    assert (outside / "keep").is_dir()


def test_a_newer_pods_work_dir_is_never_removed(node: Path) -> None:
    """A Job's replacement pod starts on the node while this one terminates,
    its agent still holding the writer's lease: the newer pod's work dir
    appears after this agent started and must survive its housekeeping (the
    kubelet would recreate the trainer's subPath as root 0700)."""
    for name in (OWN, OLD):
        _work(node, name)

    def prune_after_a_replacement_starts() -> list[str]:
        pruner = stale_work.StaleWork(node, node / OWN, lambda: None)
        (node / NEWER / "step-1").mkdir(parents=True)  # as prepare and restore leave it
        return pruner.prune()

    assert run_as(CKPTDRAIN_UID, prune_after_a_replacement_starts) == [OLD]
    assert sorted(os.listdir(node)) == sorted([NEWER, OWN])
    assert (node / NEWER / "step-1").is_dir()


def test_what_cannot_be_removed_is_counted_and_logged_once_per_dir_and_retried(
        node: Path) -> None:
    _work(node, OWN)
    old = _work(node, OLD)
    os.chown(old / "step-1", 0, 0)  # a root trainer's step, not the group's
    os.chmod(old / "step-1", 0o755)

    def prune_thrice() -> tuple[list[list[str]], int, list[str]]:
        records: list[str] = []

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                records.append(record.getMessage())

        logging.getLogger("ckptdrain.agent.stale_work").addHandler(Keep())
        failed: list[int] = []
        pruner = stale_work.StaleWork(node, node / OWN, lambda: failed.append(1))
        return [pruner.prune() for _ in range(3)], len(failed), records

    rounds, failed, records = run_as(CKPTDRAIN_UID, prune_thrice)
    assert rounds == [[], [], []] and failed == 1
    warned = [r for r in records if "cannot remove an earlier pod's work dir" in r]
    assert len(warned) == 1 and str(old / "step-1") in warned[0] and "errno 13" in warned[0]
    # Once the trainer's files are removable, the next housekeeping takes the rest.
    os.chown(old / "step-1", CKPTDRAIN_UID, GROUP)
    gone = run_as(CKPTDRAIN_UID, lambda: stale_work.StaleWork(node, node / OWN,
                                                              lambda: None).prune())
    assert gone == [OLD] and sorted(os.listdir(node)) == [OWN]


class _Quiet:
    def report(self, event: object) -> None:
        pass


class _Lease:
    """What the loop asks of the writer's lease (node/kube.WriterLease)."""

    def __init__(self, held: bool) -> None:
        self.held = held


class _Drain:
    def __init__(self, fence: object) -> None:
        self.fence = fence

    def busy_steps(self) -> set[int]:
        return set()

    def lag_bytes(self) -> int:
        return 0

    def submit(self, step: int, trigger: str) -> None:
        pass


def _agent(local: Path, work: Path, capacity: str | None = None,
           drain: object = None) -> Agent:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    env = {"CKPTDRAIN_WORK_DIR": str(work), "CKPTDRAIN_LOCAL_DIR": str(local),
           "CKPTDRAIN_LOCAL_KEEP": "5", "CKPTDRAIN_GLOBAL_EVERY": "1000000"}
    if capacity is not None:
        env["CKPTDRAIN_LOCAL_CAPACITY"] = capacity
    cfg = config.load(parser.parse_args([]), env)
    return Agent(cfg, LocalTier(cfg.local_dir), _Quiet(), AgentMetrics(),  # type: ignore[arg-type]
                 drain)  # type: ignore[arg-type]


@pytest.mark.parametrize(("fence", "pruned"), [(None, False), (_Lease(False), False),
                                               (_Lease(True), True)])
def test_housekeeping_prunes_stale_work_dirs_only_while_the_lease_is_held(
        tmp_path: Path, fence: object, pruned: bool) -> None:
    for name in (OWN, OLD, OTHER_WRITER):
        (tmp_path / name).mkdir()
    agent = _agent(tmp_path / "writer-3", tmp_path / OWN, drain=_Drain(fence))
    agent.housekeeping()
    left = set(os.listdir(tmp_path))
    assert (OLD not in left) is pruned
    assert {OWN, OTHER_WRITER} <= left


def test_without_a_drain_worker_nothing_is_pruned(tmp_path: Path) -> None:
    (tmp_path / OWN).mkdir()
    (tmp_path / OLD).mkdir()
    _agent(tmp_path / "writer-3", tmp_path / OWN).housekeeping()
    assert (tmp_path / OLD).is_dir()


def _held_after_captures(local: Path, work: Path) -> list[int]:
    work.mkdir(parents=True)  # as restore leaves it before the agent starts
    agent = _agent(local, work, capacity="4500")
    for step in range(1, 6):
        client = Client(work)
        (client.begin(step) / "w").write_bytes(os.urandom(1000))
        client.complete(step)
        assert agent.capture_newest("schedule") == step
        agent.housekeeping()
    return agent.tier.steps()


def test_on_the_node_the_tier_keeps_room_for_the_trainers_next_save_too(
        tmp_path: Path) -> None:
    # keep 5 and 1000-byte steps: with the capacity holding keep + 3 of them
    # the node's work dir keeps two steps free (the trainer's next save lands
    # on this disk too), an emptyDir's one.
    off = _agent(tmp_path / "a" / "local", tmp_path / "a" / "work", capacity="8000")
    (tmp_path / "b" / "node" / OWN).mkdir(parents=True)
    on = _agent(tmp_path / "b" / "node", tmp_path / "b" / "node" / OWN, capacity="8000")
    assert (off.reserve_steps(1000), on.reserve_steps(1000)) == (1, 2)
    assert on.reserve_steps(1001) == 1  # 8 such steps do not fit: one


def test_below_keep_plus_three_steps_the_node_keeps_one_free_and_still_captures(
        tmp_path: Path) -> None:
    # Within 4500 (keep 5): two steps kept free would hold two steps; one
    # holds three, on the node as with an emptyDir.
    off = _held_after_captures(tmp_path / "a" / "local", tmp_path / "a" / "work")
    on = _held_after_captures(tmp_path / "b" / "node", tmp_path / "b" / "node" / OWN)
    assert off == on == [5, 4, 3]


def test_the_agent_never_starts_on_a_symlink_at_its_pods_work_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The agent makes a missing work dir on the node as restore does
    (restore/pod_work.py): what stands there but is no directory of its own
    stops it, naming the dir, and nothing is made through the link."""
    import signal

    from ckptdrain.agent import command as agent

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "node").mkdir()
    (tmp_path / "node" / OWN).symlink_to(elsewhere)
    monkeypatch.delenv("CKPTDRAIN_ROLE", raising=False)
    monkeypatch.setattr(Agent, "run", lambda self: 0)  # started: it would run till SIGTERM
    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = agent.main(["--work-dir", str(tmp_path / "node" / OWN), "--local-dir",
                           str(tmp_path / "node"), "--metrics-port", "0"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 1
    assert f"the pod's work dir {tmp_path / 'node' / OWN} is a symlink" in capsys.readouterr().err
    assert os.listdir(elsewhere) == []
