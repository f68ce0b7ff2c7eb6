"""Run a function as another user, in a forked child: how tests prove that
files one uid made are usable by another uid of the pod's shared group.

The tests run as root; the child drops to `uid` with `groups` as its only
supplementary groups (what a pod's fsGroup gives every container) and the
umask a careless process might have. Its return value (or exception) comes
back pickled.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

#: The pod's shared group (the webhook's default fsGroup) and ckptdrain's uid.
GROUP = 65532
CKPTDRAIN_UID = 65532
#: A trainer that is neither root nor ckptdrain's uid.
TRAINER_UID = 1000


def need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("switching users needs root")


@contextlib.contextmanager
def node_dirs(prefix: str, root: str, *, trainer_link: bool = False) -> Iterator[Path]:
    """A node's hostPath as the prepare container leaves it: `root` (the local
    tier's) and `root/work` in a fresh directory, owned by 65532 and the pod's
    group, mode 2775; with `trainer_link`, `trainer` beside it is the trainer's
    mount of the same work dir. Yields the top directory; removed after."""
    need_root()
    top = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(top, 0o755)  # the children must reach what is below
    try:
        for d in (top / root, top / root / "work"):
            d.mkdir()
            os.chown(d, CKPTDRAIN_UID, GROUP)
            os.chmod(d, 0o2775)
        if trainer_link:
            (top / "trainer").symlink_to(top / root / "work")
        yield top
    finally:
        shutil.rmtree(top)


def run_as(uid: int, fn: Callable[[], Any], *, groups: tuple[int, ...] = (GROUP,),
           umask: int = 0o077) -> Any:
    """`fn()` in a child running as `uid` (primary group `uid`, plus `groups`)."""
    need_root()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(read)
            os.setgroups(list(groups))
            os.setgid(uid)
            os.setuid(uid)
            os.umask(umask)
            try:
                payload = (True, fn())
            except BaseException as err:  # handed to the parent, which raises it
                payload = (False, f"{type(err).__name__}: {err}\n{traceback.format_exc()}")
            with os.fdopen(write, "wb") as out:
                pickle.dump(payload, out)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as source:
        data = source.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data, f"child as uid {uid} died"
    ok, value = pickle.loads(data)
    if not ok:
        raise AssertionError(f"as uid {uid}: {value}")
    return value
