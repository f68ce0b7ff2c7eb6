"""One save written by several processes of one pod (torchrun's local ranks).

A pod is one writer; with P processes (LOCAL_WORLD_SIZE) each writes its own
files of a step into one shared directory, and the step is published once,
when the last of them is done:

    <work>/step-<N>.tmp-<save>/           every process writes here
    <work>/.ckptdrain/saves/<N>-<save>/<r>   local rank r is done (it holds the
                                          inode of the directory it wrote into)
    <work>/.ckptdrain/publish.lock        flock: marking and publishing
    <work>/step-<N>/                      renamed by whoever marks the P-th

`<save>` is an id the pod's processes share for one save (the DCP helper
broadcasts rank 0's; a plain trainer passes its own), so a process that
begins a later save of the same step never writes into an abandoned one.
It must be new for every save: a process restarted in place that reused
one would find the dead run's marks. Marks count only for the step they
name and the very directory they were written for (its inode), so a reused
id never publishes a directory another save's marks were made for.
A process that dies mid-save leaves its mark unwritten: the step is never
published from that directory, and local rank 0 removes it when the pod
next begins the same step, or any step once a newer one is published.
Everything made here is shared with the pod's group (group_access.py): the
agent, another uid, reads, links and prunes it. `local_layout` says which
of the pod's processes this one is (from the launcher's environment).
Standard library only (imported by client.py into training processes).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

from ckptdrain import group_access
from ckptdrain.contract.env import Env
from ckptdrain.errors import InvalidInput

SAVES_DIR = "saves"
PUBLISH_LOCK = "publish.lock"
#: A save id: it becomes part of a directory name, so nothing that could
#: leave the work dir or hide a file.
SAVE_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_save(save: object) -> str:
    """`save` as a valid save id; InvalidInput naming `save` otherwise."""
    if not isinstance(save, str) or not SAVE_ID.fullmatch(save) or save in (".", ".."):
        raise InvalidInput("save", "the id this pod's processes share for one save "
                           "(1-64 of A-Z a-z 0-9 _ . -, new for every save; with several processes "
                           "per pod every begin/complete needs it)", save)
    return save


def temp_dir(work_dir: Path, step: int, save: str) -> Path:
    return work_dir / f"step-{step}.tmp-{save}"


def _marks(control: Path, step: int, save: str) -> Path:
    return control / SAVES_DIR / f"{step}-{save}"


def local_layout(env: Mapping[str, str]) -> tuple[int, int]:
    """(local rank, local processes): ckptdrain's names, else torchrun's (only
    both together: DeepSpeed's and some MPI launchers set LOCAL_RANK alone),
    else (0, 1)."""
    found: list[tuple[str, int]] = []
    torchrun_pair = bool(env.get("LOCAL_RANK")) and bool(env.get("LOCAL_WORLD_SIZE"))
    for ours, torchrun, lowest in ((Env.LOCAL_RANK.value, "LOCAL_RANK", 0),
                                   (Env.LOCAL_PROCESSES.value, "LOCAL_WORLD_SIZE", 1)):
        name = ours if env.get(ours) else torchrun if torchrun_pair else ""
        raw = env.get(name, "") if name else str(lowest)
        if not (raw.isascii() and raw.isdigit()) or int(raw) < lowest:
            raise InvalidInput(name, f"a whole number of at least {lowest}", raw)
        found.append((name or ours, int(raw)))
    (rank_name, rank), (processes_name, processes) = found
    if rank >= processes:
        raise InvalidInput(rank_name, f"a local rank below the pod's {processes} local "
                           f"process(es) ({processes_name})", rank)
    return rank, processes


def begin(work_dir: Path, control: Path, step: int, save: str, local_rank: int) -> Path:
    """The shared directory of this save of `step` (made if missing, never
    emptied: other processes may already be writing into it)."""
    if local_rank == 0:
        _remove_abandoned(work_dir, control, step, keep=save)
    group_access.make_dir(_marks(control, step, save))
    return group_access.make_dir(temp_dir(work_dir, step, save))


def complete(work_dir: Path, control: Path, step: int, save: str, local_rank: int,
             processes: int, final: Path) -> bool:
    """Mark this process done; True when this call published `final` (it was
    the last one), or discarded the save because `final` already existed."""
    tmp = temp_dir(work_dir, step, save)
    if not tmp.is_dir():
        raise FileNotFoundError(f"{tmp}: call begin({step}, save={save!r}) and write the "
                                "files first")
    marks = group_access.make_dir(_marks(control, step, save))
    with _publish_lock(control):
        inode = str(os.stat(tmp).st_ino)
        mark = marks / str(local_rank)
        mark.write_text(inode)
        group_access.share(mark)
        done = sum(_mark_of(marks / str(r)) == inode for r in range(processes))
        if done < processes:
            return False
        if final.exists():  # a published step is immutable: keep the first copy
            shutil.rmtree(tmp)
        else:
            group_access.share_tree(tmp)
            os.rename(tmp, final)
        shutil.rmtree(marks, ignore_errors=True)
        return True


def _mark_of(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _remove_abandoned(work_dir: Path, control: Path, step: int, keep: str) -> None:
    """Saves that can never be published: earlier saves of `step` (the pod is
    beginning it again, so nobody writes them any more), and saves of any
    step not newer than the newest published one (a process died in them;
    the one save that may still run beside this one, an earlier step's
    asynchronous save, is newer than every published step)."""
    try:
        names = os.listdir(work_dir)
    except FileNotFoundError:
        return
    published = [int(n[5:]) for n in names
                 if n.startswith("step-") and n[5:].isdigit() and str(int(n[5:])) == n[5:]]
    newest = max(published, default=-1)
    for name in names:
        found = _temp_of(name)
        if found is None:
            continue
        other_step, other = found
        if (other_step, other) == (step, keep) or not (other_step == step
                                                       or other_step <= newest):
            continue
        shutil.rmtree(work_dir / name, ignore_errors=True)
        if other and SAVE_ID.fullmatch(other) and other not in (".", ".."):
            shutil.rmtree(_marks(control, other_step, other), ignore_errors=True)


def _temp_of(name: str) -> tuple[int, str] | None:
    """(step, save id) of a temporary step directory's name (save "" for the
    one-process `step-<N>.tmp`), else None."""
    if not name.startswith("step-"):
        return None
    digits, dot, rest = name[5:].partition(".tmp")
    if not dot or not digits.isdigit() or str(int(digits)) != digits:
        return None
    if rest == "":
        return int(digits), ""
    return (int(digits), rest[1:]) if rest.startswith("-") else None


@contextlib.contextmanager
def _publish_lock(control: Path) -> Iterator[None]:
    path = control / PUBLISH_LOCK
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                 group_access.FILE_MODE)
    try:
        group_access.share(path)  # whoever made it: the other processes open it too
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
