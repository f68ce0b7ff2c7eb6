"""The trainer's side of ckptdrain: a small, dependency-free API.

    from ckptdrain.client import Client
    ckpt = Client()                         # reads CKPTDRAIN_* from the environment
    ckpt.on_preemption(exit_code=None)      # SIGTERM only sets ckpt.preempting
    restored = ckpt.restored()              # None on a fresh start
    start = restored.step + 1 if restored else 0
    for step in range(start, steps):
        train_one_step()
        ckpt.step_done(step)                # optional: goodput (docs/goodput.md)
        if ckpt.preempting:                 # emergency checkpoint of the finished step
            save(ckpt, step)
            sys.exit(143)
        if ckpt.checkpoint_requested():
            save(ckpt, step)

    def save(ckpt, step):
        d = ckpt.begin(step)                # an empty directory to write into
        ...write files under d...
        ckpt.complete(step)                 # atomically publishes step-<N>/

The protocol (docs/trainer-protocol.md): the trainer writes `<work>/step-<N>.tmp/`
and renames it to `<work>/step-<N>/` when every file is written; the agent
never reads a `.tmp` directory. With several processes per pod (torchrun's
local ranks) they share one save: `begin(step, save=id)` and
`complete(step, save=id)` with an id they agree on, and the last to complete
publishes (pod_saves.py). The agent asks for checkpoints by rewriting
`<work>/.ckptdrain/request`; `complete` records the answer in
`<work>/.ckptdrain/ack`. Everything written to the work dir is shared with
the pod's group (group_access.py): the trainer and the agent may run as
different users. Standard library only: this module is imported into
training processes that must not pull in botocore or Kubernetes clients (the env
names come from contract/env.py, itself standard library only).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from ckptdrain import group_access, pod_saves, resume_channel
from ckptdrain.contract.env import Env
from ckptdrain.errors import InvalidInput
from ckptdrain.jsonfile import parse_object, write_json_atomic
from ckptdrain.progress import PROGRESS_FILE, Progress

CONTROL_DIR = ".ckptdrain"
REQUEST_FILE = "request"
ACK_FILE = "ack"
DEFAULT_WORK_DIR = "/ckptdrain/work"
#: How long `restored()` waits for the ranks' agreement after a restart in
#: place: the agreement's own bound (restore.agreementTimeout, 1m by default)
#: and the copy of the step.
RESUME_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Request:
    seq: int
    reason: str  # "schedule" or "sigterm"
    at: float


@dataclass(frozen=True)
class Restored:
    """What `ckptdrain restore` placed before the trainer started."""

    step: int
    path: Path
    #: "local", "peer" or "global" (restore at pod start); "work" when the
    #: trainer's own save in this pod is the step (a restart in place).
    tier: str
    bytes: int
    seconds: float


def _read_json(path: Path) -> dict[str, object] | None:
    try:
        return parse_object(path.read_bytes())
    except (FileNotFoundError, NotADirectoryError):
        return None


def read_request(work_dir: Path) -> Request | None:
    doc = _read_json(work_dir / CONTROL_DIR / REQUEST_FILE)
    if not doc or not isinstance(doc.get("seq"), int):
        return None
    return Request(int(doc["seq"]), str(doc.get("reason", "schedule")), float(doc.get("at", 0)))  # type: ignore[arg-type]


def read_ack(work_dir: Path) -> int:
    """The last request sequence number the trainer answered (-1 if none)."""
    doc = _read_json(work_dir / CONTROL_DIR / ACK_FILE)
    seq = doc.get("seq") if doc else None
    return seq if isinstance(seq, int) else -1


class Client:
    """Where to write, how to publish, whether a checkpoint is wanted, what was restored."""

    def __init__(
        self,
        work_dir: str | os.PathLike[str] | None = None,
        *,
        restore_result: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        chosen = work_dir or env.get(Env.WORK_DIR.value)
        if not chosen and not os.path.isdir(DEFAULT_WORK_DIR):
            # Outside a pod the default is nowhere: creating it (as root,
            # at the filesystem's top) would hide the missing configuration.
            raise InvalidInput(Env.WORK_DIR.value, f"the work directory (set in pods by the "
                               f"operator; elsewhere set it or pass Client(work_dir=...); "
                               f"{DEFAULT_WORK_DIR} does not exist)", None)
        self.work_dir = Path(chosen or DEFAULT_WORK_DIR)
        self.restore_result = Path(
            restore_result or env.get(Env.RESTORE_RESULT.value)
            or self.work_dir / "restore.json"
        )
        self.writer = env.get(Env.WRITER_ID.value, "0")
        self.writers = int(env.get(Env.WRITERS.value, "1") or 1)
        self._role = env.get(Env.ROLE.value) or "writer"
        #: This process among the pod's `local_processes`, which save as one writer.
        self.local_rank, self.local_processes = pod_saves.local_layout(env)
        self._preempting = threading.Event()
        #: The main thread is inside complete(); a preemption callback then
        #: waits in _deferred until it returns.
        self._completing = False
        self._deferred: Callable[[], None] | None = None
        # What only this process knows of goodput; the agent reads local rank
        # 0's file (one per pod: the pod's processes train in step).
        self.progress = Progress(self.work_dir / CONTROL_DIR / PROGRESS_FILE,
                                 write=write_json_atomic if self.local_rank == 0 else None)

    @property
    def role(self) -> str:
        """"writer", or "reader": a pod that restores shard `writer` and never
        writes (docs/pod-contract.md); a reader's saves are never captured."""
        return self._role

    # -- writing checkpoints ---------------------------------------------------
    def temp_dir(self, step: int, *, save: str | None = None) -> Path:
        if save is None:
            return self.work_dir / f"step-{_check_step(step)}.tmp"
        return pod_saves.temp_dir(self.work_dir, _check_step(step), self._save(save))

    def step_dir(self, step: int) -> Path:
        return self.work_dir / f"step-{_check_step(step)}"

    def begin(self, step: int, *, save: str | None = None) -> Path:
        """A directory to write step `step` into.

        Without `save`, one process writes the pod's whole step (the one
        process of the pod, or the one rank a trainer saves from): an empty
        directory (left over content is removed). With `save`, the id the
        pod's `local_processes` processes share for this save (new for every
        save): they all write into the same directory, each its own files,
        and the step is published once all of them completed it."""
        if save is None:
            tmp = self.temp_dir(step)
            shutil.rmtree(tmp, ignore_errors=True)
            group_access.make_dir(tmp)
        else:
            step, save = _check_step(step), self._save(save)  # before anything is made
            control = group_access.make_dir(self.work_dir / CONTROL_DIR)
            tmp = pod_saves.begin(self.work_dir, control, step, save, self.local_rank)
        self.progress.training()
        self.progress.began(step)
        return tmp

    def complete(self, step: int, *, save: str | None = None) -> Path:
        """Publish step `step`: after this the agent may capture it. Returns its directory.

        With several processes per pod, this process's files are done and the
        directory exists once every process of the pod has completed `save`
        (the last one publishes it). A published step is immutable (the agent
        may be copying it): completing it again discards the new copy and
        keeps the published one. Its files are made readable, linkable and
        removable by the pod's group before it is published.
        """
        main = threading.current_thread() is threading.main_thread()
        if main:  # where a SIGTERM handler runs: see on_preemption
            self._completing = True
        failed: BaseException | None = None
        try:
            return self._complete(step, save)
        except BaseException as err:
            failed = err
            raise
        finally:
            if main:
                self._completing = False
                deferred, self._deferred = self._deferred, None
                if deferred is not None:
                    if failed is not None:  # the exit would hide it
                        print(f"ckptdrain: complete({step}) failed: {failed!r}", file=sys.stderr)
                    deferred()

    def _complete(self, step: int, save: str | None) -> Path:
        final = self.step_dir(step)
        published = True
        if save is None:
            tmp = self.temp_dir(step)
            if not tmp.is_dir():
                raise FileNotFoundError(f"{tmp}: call begin({step}) and write the files first")
            if final.exists():
                shutil.rmtree(tmp)
            else:
                group_access.share_tree(tmp)
                os.rename(tmp, final)
        else:
            control = group_access.make_dir(self.work_dir / CONTROL_DIR)
            published = pod_saves.complete(self.work_dir, control, _check_step(step),
                                           self._save(save), self.local_rank,
                                           self.local_processes, final)
        # Answered by whoever published: an ack before the step exists would
        # tell the agent a request was met by a step it cannot capture yet.
        request = read_request(self.work_dir) if published else None
        if request is not None:
            write_json_atomic(
                self.work_dir / CONTROL_DIR / ACK_FILE,
                {"seq": request.seq, "step": step, "at": time.time()},
            )
        self.progress.completed_step(step)
        return final

    def _save(self, save: str | None) -> str:
        if save is None:
            raise InvalidInput("save", f"a save id shared by this pod's {self.local_processes} "
                               f"processes (begin(step, save=...) and complete(step, "
                               f"save=...); ckptdrain.dcp shares one itself)", None)
        return pod_saves.check_save(save)

    def step_done(self, step: int) -> None:
        """Tell ckptdrain a training step finished (optional, no I/O but the
        first time). The first call marks training again after a restart, the
        newest step is what an interruption loses: both go into the policy's
        goodput (docs/goodput.md). Without it, saves stand in for steps."""
        self.progress.step_done(_check_step(step))

    # -- control channel -------------------------------------------------------
    def checkpoint_requested(self) -> Request | None:
        """The agent's pending request, or None. Cheap: one small file read."""
        self.progress.training()
        request = read_request(self.work_dir)
        if request is None or request.seq <= read_ack(self.work_dir):
            return None
        return request

    # -- preemption ---------------------------------------------------------------
    @property
    def preempting(self) -> bool:
        """True once SIGTERM arrived (for trainers that poll instead of a callback)."""
        return self._preempting.is_set()

    def on_preemption(
        self, callback: Callable[[], object] | None = None, *, exit_code: int | None = 0
    ) -> None:
        """On SIGTERM, run `callback` (which should write an emergency checkpoint
        through begin/complete), then exit with `exit_code` (None: keep running
        and let the trainer poll `preempting`).

        The callback runs in the main thread, between bytecodes, as Python
        signal handlers do; a second SIGTERM while it runs is ignored so a
        half-written emergency checkpoint is never abandoned by us (and is
        never captured either: it is still `.tmp`). A SIGTERM that lands while
        the main thread is inside complete() runs the callback as soon as
        complete() returns.
        """

        def preempt() -> None:
            if callback is not None:
                try:
                    callback()
                except Exception as err:  # the trainer is exiting; say why, do not mask it
                    print(f"ckptdrain: emergency checkpoint failed: {err!r}", file=sys.stderr)
            if exit_code is not None:
                sys.exit(exit_code)

        def handler(signum: int, frame: FrameType | None) -> None:
            if self._preempting.is_set():
                return
            self._preempting.set()
            self.progress.interrupted()
            if self._completing:
                # The main thread is publishing a step, holding the pod's
                # publish lock: a save now would wait on it forever. The
                # emergency save follows as soon as that complete() returns.
                self._deferred = preempt
                return
            preempt()

        signal.signal(signal.SIGTERM, handler)

    # -- restore -------------------------------------------------------------------
    def restored(self, *, timeout: float = RESUME_TIMEOUT_S) -> Restored | None:
        """The step to resume from, or None for a fresh start.

        When the pod starts, that is what `ckptdrain restore` placed. After
        the trainer restarted inside its pod (a crashed process, an in-place
        restart), it is the newest complete step whatever put it there: with
        one writer the newest in the work dir; with several, the step every
        rank agrees on, asked of this pod's agent (it waits at most `timeout`
        seconds, then raises: resuming alone from another step than the
        other ranks would mix two states).
        """
        first = self._placed_at_start()
        newest = next(iter(_complete_steps(self.work_dir)), None)
        if newest is None or (first is not None and newest <= first.step):
            return first
        if self.writers == 1:
            return Restored(step=newest, path=self.step_dir(newest), tier="work",
                            bytes=_tree_bytes(self.step_dir(newest)), seconds=0.0)
        return self._agreed_by_the_agent(timeout)

    def _agreed_by_the_agent(self, timeout: float) -> Restored | None:
        control = self.work_dir / CONTROL_DIR
        asked = time.time()
        write_json_atomic(control / resume_channel.REQUEST_FILE,
                          {"at": asked, "pid": os.getpid()})
        deadline = time.monotonic() + timeout
        while True:
            answer = resume_channel.read_answer(control)
            if answer is not None and answer.covers >= asked:
                break
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"ckptdrain: the agent did not say which step to resume from within "
                    f"{timeout:.0f}s (is the ckptdrain-agent sidecar running?); with "
                    f"{self.writers} writers no rank resumes alone")
            time.sleep(0.2)
        if not answer.ok:
            raise RuntimeError(f"ckptdrain: the ranks agreed on step {answer.step} (round "
                               f"{answer.round}) and it could not be placed: {answer.reason}")
        if answer.step is None:
            return None
        path = self.step_dir(answer.step)
        return Restored(step=answer.step, path=path, tier=answer.tier,
                        bytes=_tree_bytes(path), seconds=time.time() - asked)

    def _placed_at_start(self) -> Restored | None:
        """What restore placed when the pod started, or None on a fresh start."""
        doc = _read_json(self.restore_result)
        if not doc or doc.get("fresh_start") or not isinstance(doc.get("step"), int):
            return None
        step = int(doc["step"])  # type: ignore[arg-type]
        # `name` is the step's directory in the work dir, whatever path
        # restore saw it at (its mount of the work dir may differ from ours);
        # `path` is for results written before `name` existed.
        if doc.get("name") == f"step-{step}":
            path = self.step_dir(step)
        else:
            path = Path(str(doc.get("path") or self.step_dir(step)))
        if not path.is_dir():
            return None
        return Restored(
            step=int(doc["step"]),  # type: ignore[arg-type]
            path=path,
            tier=str(doc.get("tier", "")),
            bytes=int(doc.get("bytes", 0)),  # type: ignore[arg-type]
            seconds=float(doc.get("seconds", 0.0)),  # type: ignore[arg-type]
        )


def _complete_steps(work_dir: Path) -> list[int]:
    """Published step directories in the work dir, newest first (the trainer
    protocol: only a renamed `step-<N>` is complete)."""
    try:
        names = os.listdir(work_dir)
    except OSError:
        return []
    found = []
    for name in names:
        digits = name[len("step-"):] if name.startswith("step-") else ""
        if digits.isdigit() and str(int(digits)) == digits and (work_dir / name).is_dir():
            found.append(int(digits))
    return sorted(found, reverse=True)


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _check_step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 10**18:
        raise ValueError(f"step must be a whole number in [0, 1e18), got {step!r}")
    return step
