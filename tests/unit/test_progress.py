"""The trainer's progress file (progress.py) as the client keeps it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ckptdrain.client import Client
from ckptdrain.contract.goodput import from_progress
from ckptdrain.progress import MAX_COMPLETED, Progress


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_blocked_time_steps_and_saves(tmp_path: Path) -> None:
    clock = Clock()
    written: list[dict] = []
    progress = Progress(tmp_path / "p", clock=clock, monotonic=clock,
                        write=lambda path, doc: written.append(doc))
    progress.step_done(40)
    assert len(written) == 1 and written[0]["trainingAt"] == 1000.0
    for step in range(41, 51):
        clock.now += 0.5
        progress.step_done(step)
    assert len(written) == 1  # no write per step
    progress.began(50)
    clock.now += 2.0
    progress.completed_step(50)
    doc = written[-1]
    assert doc["blockedSeconds"] == pytest.approx(2.0) and doc["saves"] == 1
    assert doc["completed"] == {"50": 1007.0} and doc["step"] == 50
    assert doc["stepSeconds"] == pytest.approx(0.5)
    assert doc["firstStep"] == 40 and doc["interruptedAt"] is None


def test_only_the_newest_completions_are_kept(tmp_path: Path) -> None:
    progress = Progress(tmp_path / "p")
    for step in range(MAX_COMPLETED + 10):
        progress.completed_step(step)
    assert sorted(progress.completed) == list(range(10, MAX_COMPLETED + 10))


def test_client_writes_progress_and_the_sigterm(tmp_path: Path) -> None:
    client = Client(tmp_path, environ={})
    client.step_done(0)
    client.begin(1)
    client.step_done(1)

    def emergency() -> None:
        client.begin(2)
        client.complete(2)

    client.on_preemption(emergency, exit_code=None)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    doc = json.loads((tmp_path / ".ckptdrain" / "progress").read_text())
    assert doc["interruptedAt"] is not None and doc["step"] == 2
    assert "2" in doc["completed"] and doc["saves"] == 1
    view = from_progress(doc, newest_local=2, newest_global=None)
    assert view.interrupted_at == doc["interruptedAt"] and view.step == 2


def test_client_without_step_done_marks_training_at_its_first_poll(tmp_path: Path) -> None:
    client = Client(tmp_path, environ={})
    assert not (tmp_path / ".ckptdrain" / "progress").exists()
    client.checkpoint_requested()
    doc = json.loads((tmp_path / ".ckptdrain" / "progress").read_text())
    assert doc["trainingAt"] is not None and doc["firstStep"] is None


def test_step_done_refuses_a_bad_step(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="step must be"):
        Client(tmp_path, environ={}).step_done(-1)


def test_an_asynchronous_save_is_blocked_only_until_it_is_handed_off(tmp_path: Path) -> None:
    clock = Clock()
    progress = Progress(tmp_path / "p", clock=clock, monotonic=clock)
    progress.began(7)
    clock.now += 0.25
    progress.unblocked(7)
    clock.now += 30.0  # the background upload
    progress.completed_step(7)
    assert progress.blocked_s == pytest.approx(0.25) and progress.saves == 1


#: A trainer whose SIGTERM lands while its first step_done holds the
#: progress lock.
SIGTERM_INSIDE_STEP_DONE = """
import os, signal, sys, time
from pathlib import Path
from ckptdrain.client import Client
client = Client(Path(sys.argv[1]), environ={})
def emergency():
    client.begin(1)
    (client.temp_dir(1) / "w").write_bytes(b"weights")
    client.complete(1)
client.on_preemption(emergency, exit_code=7)
tick = client.progress.monotonic
def monotonic():  # called with the lock held
    os.kill(os.getpid(), signal.SIGTERM)
    return tick()
client.progress.monotonic = monotonic
client.step_done(0)
time.sleep(30)
"""


def _trainer(program: str, work: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:  # killed with SIGKILL at the timeout: the handler ignores a second SIGTERM
        return subprocess.run([sys.executable, "-c", program, str(work)],
                              env=env, timeout=20, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        pytest.fail("the SIGTERM handler waited for a lock its own thread holds")


def test_sigterm_while_the_progress_lock_is_held_still_saves_and_exits(tmp_path: Path) -> None:
    done = _trainer(SIGTERM_INSIDE_STEP_DONE, tmp_path)
    assert done.returncode == 7, done.stderr
    assert (tmp_path / "step-1" / "w").read_bytes() == b"weights"
    doc = json.loads((tmp_path / ".ckptdrain" / "progress").read_text())
    assert doc["interruptedAt"] is not None and "1" in doc["completed"]
    assert not [p.name for p in (tmp_path / ".ckptdrain").iterdir() if p.name.endswith(".tmp")]


#: Two processes of one pod; this one publishes step 1 (the other's mark is
#: made first) and the SIGTERM lands while it holds the pod's publish lock.
SIGTERM_WHILE_PUBLISHING = """
import os, signal, sys
from pathlib import Path
from ckptdrain import group_access
from ckptdrain.client import Client
work = Path(sys.argv[1])
other = Client(work, environ={"CKPTDRAIN_LOCAL_RANK": "1", "CKPTDRAIN_LOCAL_PROCESSES": "2"})
client = Client(work, environ={"CKPTDRAIN_LOCAL_RANK": "0", "CKPTDRAIN_LOCAL_PROCESSES": "2"})
def save(step, save):
    for c in (other, client):
        (c.begin(step, save=save) / f"p{c.local_rank}").write_bytes(b"w%d" % step)
    other.complete(step, save=save)
    client.complete(step, save=save)
client.on_preemption(lambda: save(2, "emergency"), exit_code=7)
share_tree = group_access.share_tree
def share_tree_then_sigterm(root):  # called under the publish lock
    share_tree(root)
    if not client.preempting:
        os.kill(os.getpid(), signal.SIGTERM)
group_access.share_tree = share_tree_then_sigterm
save(1, "scheduled")
"""


def test_sigterm_while_a_step_is_published_saves_after_it(tmp_path: Path) -> None:
    done = _trainer(SIGTERM_WHILE_PUBLISHING, tmp_path)
    assert done.returncode == 7, done.stderr
    for step in (1, 2):
        got = {p.name: p.read_bytes() for p in (tmp_path / f"step-{step}").iterdir()}
        assert got == {"p0": b"w%d" % step, "p1": b"w%d" % step}


#: A trainer that polls `preempting`: the SIGTERM lands half-way through
#: the progress write of its first step.
SIGTERM_WHILE_PROGRESS_IS_WRITTEN = """
import os, signal, sys
from pathlib import Path
from ckptdrain import jsonfile
from ckptdrain.client import Client
client = Client(Path(sys.argv[1]), environ={})
client.on_preemption(None, exit_code=None)
share = jsonfile.group_access.share
def share_then_sigterm(path):  # between the temporary file and its rename
    share(path)
    if ".progress." in path.name and not client.preempting:
        os.kill(os.getpid(), signal.SIGTERM)
jsonfile.group_access.share = share_then_sigterm
client.step_done(0)
assert client.preempting
"""


def test_the_interrupted_progress_write_does_not_hide_the_sigterm(tmp_path: Path) -> None:
    done = _trainer(SIGTERM_WHILE_PROGRESS_IS_WRITTEN, tmp_path)
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / ".ckptdrain" / "progress").read_text())
    assert doc["interruptedAt"] is not None and doc["trainingAt"] is not None


#: The SIGTERM lands in a later step_done while another thread finishes the
#: previous save, and the callback waits for that save (as a trainer with
#: an asynchronous save in flight would).
SIGTERM_WHILE_A_SAVE_FINISHES_ELSEWHERE = """
import os, signal, sys, threading
from pathlib import Path
from ckptdrain.client import Client
client = Client(Path(sys.argv[1]), environ={})
client.step_done(0)
(client.begin(1) / "w").write_bytes(b"1")
ready, done = threading.Event(), threading.Event()
def finish():
    ready.wait()
    client.complete(1)
    done.set()
threading.Thread(target=finish, daemon=True).start()
def emergency():
    ready.set()
    if not done.wait(10):
        sys.exit(9)  # the other thread waits for a lock this one holds
client.on_preemption(emergency, exit_code=7)
tick = client.progress.monotonic
def monotonic():
    os.kill(os.getpid(), signal.SIGTERM)
    return tick()
client.progress.monotonic = monotonic
client.step_done(1)
"""


def test_a_callback_can_wait_for_a_save_another_thread_completes(tmp_path: Path) -> None:
    done = _trainer(SIGTERM_WHILE_A_SAVE_FINISHES_ELSEWHERE, tmp_path)
    assert done.returncode == 7, done.stderr
    assert (tmp_path / "step-1" / "w").read_bytes() == b"1"
