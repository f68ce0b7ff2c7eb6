"""The work dir as restore leaves it for the trainer: emptied, then shared.

Each pod starts with an empty work dir, as an emptyDir did. On the local
tier's disk (a hostPath, docs/pod-contract.md) each pod has its own,
`work-<writer>-<pod uid>` (so a replacement pod never empties the dir of the
old pod still terminating on the node; the agent removes such dirs later,
agent/stale_work.py), yet it may still hold what this pod left before its
sandbox restarted: steps, half-written `step-<N>.tmp*`, the `.ckptdrain/`
control files, an old restore.json. Any of those would look
like this pod's own (a stale newer step as the newest checkpoint, an old
request as a pending one), so restore removes every entry before placing
anything. Only restore does it: it runs once per pod start, before the
trainer; the agent, which restarts inside a running pod, never does.

The pod's own work dir on the node is made by restore before the trainer's
mount (restore/pod_work.py), never through a symlink; restore empties it
through the descriptor of the directory it checked, never by its path
again, and refuses when another dir or a symlink stands at its name after.

Nothing is followed out of the work dir: a symlink in it is removed, not
entered. What cannot be removed (a trainer's step in a directory the group
may not write) stops restore with the path and the reason: silently left
behind, it would be captured or resumed from as if this pod had written it.

The agent prunes steps with the same `remove_tree`, and says what it could
not remove.

The trainer mounts the same directory elsewhere than restore and the agent
(`/ckptdrain/work` against `/ckptdrain/local/work-<writer>-<pod uid>`), so a
step is named to it by its name in the work dir, and by its path under the
trainer's mount (`trainer_path`).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from ckptdrain import group_access
from ckptdrain.errors import CkptdrainError, InvalidInput
from ckptdrain.node.steps import step_name
from ckptdrain.restore import pod_work


class NotEmptied(CkptdrainError):
    """Something a previous pod left in the work dir could not be removed."""


def empty(work_dir: Path, keep_out: tuple[Path, ...] = (), *, pod_dir: bool = False,
          group: int | None = None) -> int:
    """Remove everything in `work_dir` (not the directory itself), creating
    it shared when missing; how many entries were removed. `keep_out`: paths
    that must never be inside the work dir (the local tier: emptying it would
    delete the node's copies). With `pod_dir` it is the pod's own work dir
    on the node, made (or checked) by restore/pod_work.py with `group`
    first (ForeignWorkDir when it may not be). Raises NotEmptied naming the
    first path that could not go, after removing all it could."""
    work = Path(os.path.abspath(work_dir))
    for other in keep_out:
        other = Path(os.path.abspath(other))
        if other == work or work in other.parents:
            raise InvalidInput("CKPTDRAIN_WORK_DIR", f"a directory that does not hold {other} "
                               "(restore empties the work dir at each pod start)", str(work))
    if pod_dir:
        fd = pod_work.make_open(work, group)
    else:
        group_access.make_dir(work)
        fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    failures: list[tuple[str, OSError]] = []
    removed = 0
    try:
        # Through the directory restore checked, never by its path again: a
        # symlink swapped in at the name later is neither followed nor emptied.
        with os.scandir(fd) as entries:
            for entry in entries:
                problems = _remove_at(fd, entry, work)
                failures += problems
                removed += not problems
        if pod_dir:
            pod_work.check_unmoved(work, fd)
    finally:
        os.close(fd)
    if failures:
        path, err = failures[0]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise NotEmptied(f"cannot empty the work dir {work} of what a previous pod left: "
                         f"{path}: {err.strerror or err}{more}; the trainer's files there must "
                         "be removable by the pod's group (docs/pod-contract.md)")
    return removed


#: What the agent renames a step to before removing it, so it stops being a
#: step at once (`step-<N>` no longer); what cannot be removed is found by it.
ASIDE_PREFIX = ".prune-step-"


def aside(work_dir: Path, step: int, more: int = 0) -> Path:
    """Where `step` goes before it is removed (`more`: another try's name)."""
    return Path(work_dir) / f"{ASIDE_PREFIX}{step}-{os.getpid()}{f'-{more}' if more else ''}"


def remove_tree(path: Path) -> list[tuple[str, OSError]]:
    """Remove `path` (a directory with everything in it, or a file or symlink,
    never followed), as much of it as can go; what could not, with why. A
    path already gone is no problem."""
    failures: list[tuple[str, OSError]] = []

    def failed(_function: object, where: str, err: BaseException) -> None:
        if not isinstance(err, FileNotFoundError):
            failures.append((where, err if isinstance(err, OSError) else OSError(str(err))))

    try:
        if path.is_dir() and not path.is_symlink():
            if sys.version_info >= (3, 12):
                shutil.rmtree(path, onexc=failed)
            else:
                shutil.rmtree(path, onerror=lambda f, p, info: failed(f, p, info[1]))
        else:
            path.unlink()
    except OSError as err:
        failed(None, str(path), err)
    return failures


def _remove_at(fd: int, entry: os.DirEntry[str], work: Path) -> list[tuple[str, OSError]]:
    """Remove the entry `entry` of the directory `fd` (relative to it, never
    following a symlink), as much as can go; what could not, with why."""
    failures: list[tuple[str, OSError]] = []

    def failed(_function: object, where: str, err: BaseException) -> None:
        if not isinstance(err, FileNotFoundError):
            failures.append((str(work / where),
                             err if isinstance(err, OSError) else OSError(str(err))))

    try:
        if entry.is_dir(follow_symlinks=False):
            if sys.version_info >= (3, 12):
                shutil.rmtree(entry.name, dir_fd=fd, onexc=failed)
            else:
                shutil.rmtree(entry.name, dir_fd=fd, onerror=lambda f, p, i: failed(f, p, i[1]))
        else:
            os.unlink(entry.name, dir_fd=fd)
    except OSError as err:
        failed(None, entry.name, err)
    return failures


def trainer_path(trainer_work_dir: Path, step: int) -> str:
    """Where the trainer finds `step`: under its own mount of the work dir."""
    return str(Path(trainer_work_dir) / step_name(step))
