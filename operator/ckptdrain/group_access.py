"""The work dir is shared by processes of different users: the trainer (root,
as NGC images run, or any uid, as OpenShift assigns) and ckptdrain's own
containers (uid 65532). What they share is a group: the pod's fsGroup, which
every container of the pod holds (the webhook adds one when the pod has
none, docs/pod-contract.md). Standard library only (imported by client.py).

So everything either side creates there is usable by the group, whoever
created it, and never by relying on the creator's umask:

- directories `0o2775`: group-writable (the agent prunes the trainer's old
  steps; the trainer writes its ack beside the agent's request), and setgid,
  so what is created inside belongs to the shared group too;
- files `0o664`: group-readable (the agent captures them) and
  group-writable (a kernel with protected hard links lets the agent link a
  file it does not own only if it may also write it).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

DIR_MODE = 0o2775
FILE_MODE = 0o664


def make_dir(path: Path) -> Path:
    """`path` (and missing parents) as a shared directory; an existing one is
    made shared when this process may (its owner or root), else left as is."""
    missing = []
    at = path
    while not at.exists() and at != at.parent:
        missing.append(at)
        at = at.parent
    path.mkdir(parents=True, exist_ok=True)
    for made in (*reversed(missing), path):
        share(made)
    return path


def share(path: Path) -> None:
    """Give `path` its shared mode: best effort, never through a symlink (it
    is opened without following one, then changed by descriptor), and only
    where this process may (chmod needs ownership: a file someone else made
    stays as they made it)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            mode = os.fstat(fd).st_mode
            want = DIR_MODE if stat.S_ISDIR(mode) else FILE_MODE if stat.S_ISREG(mode) else 0
            if want and stat.S_IMODE(mode) & want != want:
                os.fchmod(fd, stat.S_IMODE(mode) | want)
        finally:
            os.close(fd)


def share_tree(root: Path) -> None:
    """Give `root` and everything under it the shared modes (symlinks are
    neither followed nor changed). Cheap: one lstat per entry, a chmod only
    where the mode lacks something."""
    share(root)
    for current, dirs, files in os.walk(root, followlinks=False):
        for name in (*dirs, *files):
            share(Path(current) / name)
