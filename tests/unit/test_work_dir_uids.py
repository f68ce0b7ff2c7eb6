"""The trainer and the agent run as different users and share the pod's group:
whatever either side writes in the work dir, the other can use. Real users:
forked children drop to uid 1000 (a trainer), 65532 (the agent) or stay root
(the NGC images' trainer), each with the pod's fsGroup as a supplementary
group and a strict umask, so nothing works by the umask's grace."""

from __future__ import annotations

import os
import shutil
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ckptdrain.client import ACK_FILE, CONTROL_DIR, REQUEST_FILE, Client
from ckptdrain.group_access import make_dir
from ckptdrain.jsonfile import write_json_atomic
from ckptdrain.node.steps import completed_steps
from ckptdrain.progress import PROGRESS_FILE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")

FS_GROUP = 4242
AGENT, TRAINER = 65532, 1000


def as_user(uid: int, fn: Callable[[], object]) -> None:
    """Run `fn` in a forked child as `uid` (primary group its own, the pod's
    fsGroup supplementary, umask 077); its failure fails the caller."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read)
        code = 0
        try:
            os.umask(0o077)
            os.setgroups([FS_GROUP])
            os.setgid(uid)
            os.setuid(uid)
            fn()
        except BaseException:
            os.write(write, traceback.format_exc().encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        failure = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"as uid {uid}:\n{failure}"


@pytest.fixture
def work() -> Iterator[Path]:
    """An fsGroup volume as the kubelet makes it: root-owned, the pod's group, 2775."""
    top = Path(tempfile.mkdtemp(prefix="ckptdrain-uids-"))
    top.chmod(0o755)
    (top / "work").mkdir()
    os.chown(top / "work", 0, FS_GROUP)
    (top / "work").chmod(0o2775)
    (top / "local").mkdir()  # the agent's own tier on the same filesystem
    os.chown(top / "local", AGENT, AGENT)
    try:
        yield top / "work"
    finally:
        shutil.rmtree(top)


def _save(work: Path, step: int) -> None:
    c = Client(work, environ={})
    d = c.begin(step)
    (d / "nested").mkdir()
    (d / "nested" / "shard.bin").write_bytes(b"s" * 100)
    (d / "meta.json").write_text("{}")
    c.complete(step)


def test_a_uid_1000_trainer_completes_after_the_agent_made_the_control_dir(work: Path) -> None:
    as_user(AGENT, lambda: write_json_atomic(work / CONTROL_DIR / REQUEST_FILE,
                                             {"seq": 1, "reason": "sigterm", "at": 0}))
    assert (work / CONTROL_DIR).stat().st_uid == AGENT

    def trainer() -> None:
        c = Client(work, environ={})
        assert c.checkpoint_requested() is not None
        _save(work, 4)
        assert c.checkpoint_requested() is None
    as_user(TRAINER, trainer)
    assert completed_steps(work) == [4]
    assert (work / CONTROL_DIR / ACK_FILE).stat().st_uid == TRAINER

    def agent_prunes_and_asks_again() -> None:
        shutil.rmtree(work / "step-4")
        write_json_atomic(work / CONTROL_DIR / REQUEST_FILE, {"seq": 2, "reason": "schedule"})
    as_user(AGENT, agent_prunes_and_asks_again)
    assert completed_steps(work) == []


def test_a_root_trainers_step_can_be_linked_renamed_and_removed_by_the_agent(
        work: Path) -> None:
    as_user(0, lambda: _save(work, 9))
    step = work / "step-9"
    assert step.stat().st_uid == 0 and step.stat().st_gid == FS_GROUP

    def agent() -> None:
        local = work.parent / "local"
        assert (step / "nested" / "shard.bin").read_bytes() == b"s" * 100
        # Protected hard links: a file one does not own is linked only if writable.
        os.link(step / "nested" / "shard.bin", local / "shard.bin")
        os.link(step / "meta.json", local / "meta.json")
        os.rename(step, work / "step-9.pruning")
        shutil.rmtree(work / "step-9.pruning")
    as_user(AGENT, agent)
    assert not step.exists()
    assert (work.parent / "local" / "shard.bin").read_bytes() == b"s" * 100


def test_a_root_trainers_ack_and_progress_are_read_and_replaced_by_other_users(
        work: Path) -> None:
    as_user(AGENT, lambda: write_json_atomic(work / CONTROL_DIR / REQUEST_FILE,
                                             {"seq": 3, "reason": "schedule"}))
    as_user(0, lambda: _save(work, 1))
    ack = work / CONTROL_DIR / ACK_FILE
    assert ack.stat().st_uid == 0

    def agent_reads() -> None:
        assert Client(work, environ={}).checkpoint_requested() is None  # reads the ack
        assert (work / CONTROL_DIR / PROGRESS_FILE).read_bytes()

    def trainer_restarted_as_another_user() -> None:
        write_json_atomic(work / CONTROL_DIR / REQUEST_FILE, {"seq": 5, "reason": "sigterm"})
        _save(work, 2)  # replaces root's ack and progress
    as_user(AGENT, agent_reads)
    as_user(TRAINER, trainer_restarted_as_another_user)
    assert ack.stat().st_uid == TRAINER
    assert completed_steps(work) == [2, 1]


def test_several_processes_of_a_uid_1000_pod_publish_beside_the_agent(work: Path) -> None:
    as_user(AGENT, lambda: make_dir(work / CONTROL_DIR))

    def pod() -> None:
        ranks = [Client(work, environ={"CKPTDRAIN_LOCAL_RANK": str(r),
                                       "CKPTDRAIN_LOCAL_PROCESSES": "2"}) for r in range(2)]
        for c in ranks:
            (c.begin(6, save="a") / f"r{c.local_rank}").write_text("x")
        for c in ranks:
            c.complete(6, save="a")
    as_user(TRAINER, pod)
    as_user(AGENT, lambda: shutil.rmtree(work / "step-6"))
    assert completed_steps(work) == []
