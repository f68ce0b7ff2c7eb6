"""The trainer's work dir in the CSI driver's volume, end to end on one
machine: the real driver publishes the policy's data (a real bind mount, as
kubelet asks), `ckptdrain restore` (uid 65532, the pod's fsGroup) makes the
pod's own `work-<writer>-<pod uid>` in it, the trainer (another uid) writes
through a bind mount of that dir alone (what kubelet's subPathExpr mount
is), and the agent captures the step by hard link: the same inode.
A later pod of the policy with another fsGroup gets a work dir of its own
group, which its trainer writes although the data dir is the first group's.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.asuser import CKPTDRAIN_UID, TRAINER_UID, run_as
from tests.support.csi_driver import AS_ROOT_ON_LINUX, UID_A, Harness, new_pod_uid, running_driver

from ckptdrain.agent.loop import Agent
from ckptdrain.agent.metrics import AgentMetrics
from ckptdrain.client import Client
from ckptdrain.csi import mounts
from ckptdrain.node import config
from ckptdrain.node.localtier import LocalTier
from ckptdrain.restore import command

pytestmark = AS_ROOT_ON_LINUX


class _Quiet:
    def report(self, event: object) -> None:
        pass


@pytest.fixture
def harness() -> Iterator[Harness]:
    with running_driver() as h:
        # The children of other uids reach the volume by its path here;
        # in a pod each container has it at its own mount point.
        os.chmod(h.cfg.root.parent, 0o755)
        yield h


def _reachable(path: Path, stop: Path) -> None:
    for parent in path.parents:
        if parent == stop:
            return
        os.chmod(parent, 0o755)


def _env(target: Path, pod: str, group: int, store: Path) -> dict[str, str]:
    """What the webhook gives restore and the agent (pod_env.agent_env),
    with the pod's mount of the driver's volume at `target`."""
    return {"CKPTDRAIN_WORK_DIR": str(target / f"work-0-{pod}"),
            "CKPTDRAIN_TRAINER_WORK_DIR": "/ckptdrain/work", "CKPTDRAIN_LOCAL_DIR": str(target),
            "CKPTDRAIN_WORK_GROUP": str(group), "CKPTDRAIN_STORE_URI": f"file://{store}",
            "CKPTDRAIN_POLICY": "team-a/ckpt", "CKPTDRAIN_POD_UID": pod,
            "CKPTDRAIN_WRITER_ID": "0", "CKPTDRAIN_WRITERS": "1",
            "CKPTDRAIN_RESTORE_RESULT": str(target / f"work-0-{pod}" / "restore.json")}


def _restore(env: dict[str, str], group: int) -> int:
    def run() -> int:
        os.environ.update(env)
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)
        return command.run(parser.parse_args([]))
    return run_as(CKPTDRAIN_UID, run, groups=(group,))


def _trainer_saves(mount: Path, step: int, group: int) -> None:
    def save() -> None:
        client = Client(mount)
        (client.begin(step) / "model.bin").write_bytes(bytes([step]) * 8192)
        client.complete(step)
    run_as(TRAINER_UID, save, groups=(group,))


def _agent_captures(env: dict[str, str], group: int) -> tuple[int | None, int, list[str]]:
    """The agent's capture of the newest step; how many steps of room it
    keeps for a step of 8 KiB (2: no capacity set, and the trainer's next
    save lands on the tier's disk too); the
    earlier pods' work dirs it removed (as once it holds the writer's lease)."""
    def capture() -> tuple[int | None, int, list[str]]:
        parser = argparse.ArgumentParser()
        config.add_arguments(parser)
        cfg = config.load(parser.parse_args([]), env)
        agent = Agent(cfg, LocalTier(cfg.local_dir), _Quiet(), AgentMetrics(), None)  # type: ignore[arg-type]
        assert agent.stale_work is not None, "the work dir is not seen on the tier's volume"
        return (agent.capture_newest("schedule"), agent.reserve_steps(8192),
                agent.stale_work.prune())
    return run_as(CKPTDRAIN_UID, capture, groups=(group,))


def _pod(harness: Harness, group: int, store: Path, mounts_dir: Path
         ) -> tuple[Path, Path, dict[str, str]]:
    """A pod of the policy on this node: its volume published, restore run,
    then its trainer's subPath mount made (kubelet, at the trainer's start)."""
    pod = new_pod_uid()
    target = harness.target(pod)
    harness.publish(target, "team-a", pod, group=str(group))
    _reachable(target, harness.cfg.root.parent)
    env = _env(target, pod, group, store)
    assert _restore(env, group) == 0
    trainer = mounts_dir / pod
    trainer.mkdir()
    mounts.bind(target / f"work-0-{pod}", trainer, read_only=False)
    return target, trainer, env


def test_the_trainer_works_in_the_volume_and_capture_links(harness: Harness) -> None:
    harness.policies[("team-a", "ckpt")] = UID_A
    top = Path(tempfile.mkdtemp(prefix="ckptdrain-csiwork-", dir=harness.cfg.root.parent))
    os.chmod(top, 0o755)
    store, trainers = top / "store", top / "trainers"
    store.mkdir()
    os.chown(store, CKPTDRAIN_UID, CKPTDRAIN_UID)
    trainers.mkdir()
    made: list[Path] = []
    try:
        target, trainer, env = _pod(harness, 2000, store, trainers)
        made.append(trainer)
        work = target / f"work-0-{env['CKPTDRAIN_POD_UID']}"
        st = os.stat(work)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (CKPTDRAIN_UID, 2000, 0o2775)
        _trainer_saves(trainer, 4, 2000)
        assert _agent_captures(env, 2000) == (4, 2, [])
        taken = LocalTier(target).data_dir(4) / "model.bin"
        assert os.stat(taken).st_ino == os.stat(trainer / "step-4" / "model.bin").st_ino

        # A later pod with another fsGroup: the data stays the first group's,
        # its work dir is its own group's, and its trainer writes there.
        target2, trainer2, env2 = _pod(harness, 3000, store, trainers)
        made.append(trainer2)
        data = os.stat(target2)
        assert (data.st_gid, data.st_mode & 0o7777) == (2000, 0o2770)
        assert os.stat(trainer2).st_gid == 3000
        # Run again (the pod's sandbox restarted), restore keeps its own dir.
        assert _restore(env2, 3000) == 0
        assert os.stat(trainer2).st_gid == 3000
        _trainer_saves(trainer2, 5, 3000)
        # The first pod is gone. Its trainer's step there is its group's
        # (2000): the later pod's agent (3000) cannot remove it (it counts
        # and logs that, agent/stale_work.py).
        mounts.unmount(trainer)
        assert _agent_captures(env2, 3000) == (5, 2, [])
        first = target2 / f"work-0-{env['CKPTDRAIN_POD_UID']}"
        assert sorted(os.listdir(first)) == [".ckptdrain", "step-4"]  # its trainer's
        with pytest.raises(AssertionError, match="Permission denied"):
            run_as(TRAINER_UID, lambda: os.listdir(target2), groups=(3000,))
        # The second pod gone too, a third of the first group removes the
        # first pod's dir whole, and of the second's what its group may.
        mounts.unmount(trainer2)
        target3, trainer3, env3 = _pod(harness, 2000, store, trainers)
        made.append(trainer3)
        _trainer_saves(trainer3, 6, 2000)
        assert _agent_captures(env3, 2000) == (6, 2, [first.name])
        second = target3 / f"work-0-{env2['CKPTDRAIN_POD_UID']}"
        assert sorted(os.listdir(second)) == [".ckptdrain", "step-5"]  # its trainer's
    finally:
        for mount in made:
            while mounts.is_mount_point(mount):
                mounts.unmount(mount)


def test_restore_refuses_a_dir_kubelet_made_before_it(
        harness: Harness, capfd: pytest.CaptureFixture[str]) -> None:
    # Root's, with the volume's mode: what kubelet makes for a missing subPath.
    harness.policies[("team-a", "ckpt")] = UID_A
    store = Path(tempfile.mkdtemp(prefix="ckptdrain-csiwork-", dir=harness.cfg.root.parent))
    os.chown(store, CKPTDRAIN_UID, CKPTDRAIN_UID)
    pod = new_pod_uid()
    target = harness.target(pod)
    harness.publish(target, "team-a", pod, group="2000")
    _reachable(target, harness.cfg.root.parent)
    (target / f"work-0-{pod}").mkdir()
    os.chmod(target / f"work-0-{pod}", 0o2770)
    (target / f"work-0-{pod}" / "left.bin").write_bytes(b"x")
    capfd.readouterr()
    assert _restore(_env(target, pod, 2000, store), 2000) == 1
    assert f"work-0-{pod} is owned by uid 0" in capfd.readouterr().err
    assert (target / f"work-0-{pod}" / "left.bin").exists()
    assert os.stat(target / f"work-0-{pod}").st_uid == 0
