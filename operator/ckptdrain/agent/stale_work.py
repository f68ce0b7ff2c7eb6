"""Work dirs that earlier pods of this writer left on the node.

On a disk local tier each pod has its own work dir in the tier's volume
(the hostPath or the CSI driver's: the same layout),
`<volume>/work-<writer>-<pod uid>` (admission/work_dir.py): a replacement pod
may start while the old one still terminates, and must neither empty nor
share the old trainer's dir. Once the old pod is gone its dir is stale: the
agent removes it, but only while it holds the writer's lease (the old pod
lost it, so nothing there is still written or drained), never its own dir,
never another writer's, never one that appeared after the agent started (a
newer pod's: the old pod's agent may still hold the lease when it appears).

Which dirs are stale is pure (`stale`); removal is best effort, never
follows a symlink, and what cannot go is reported once per dir and tried
again at the next housekeeping.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from ckptdrain.restore import pod_work, workdir
from ckptdrain.restore.pod_work import WORK_NAME

log = logging.getLogger(__name__)


def volume_root(work_dir: Path, local_dir: Path) -> Path | None:
    """The local tier's volume holding `work_dir`, or None when the work dir is
    not on the node (an emptyDir). On the node it is a pod's work dir
    (pod_work.is_pod_dir: at `local_dir` itself, one writer, or its parent,
    `writer-<id>`, several) on the same filesystem."""
    if not pod_work.is_pod_dir(work_dir, local_dir):
        return None
    work, local = Path(os.path.abspath(work_dir)), Path(os.path.abspath(local_dir))
    probe = local  # `writer-<id>` may not exist yet: its volume does
    while not probe.exists() and probe != work.parent:
        probe = probe.parent
    try:
        same = os.stat(work.parent).st_dev == os.stat(probe).st_dev
    except OSError:
        return None
    return work.parent if same else None


def stale(own: str, names: Iterable[str]) -> list[str]:
    """The names among `names` of this writer's work dirs other than `own`
    (this pod's); [] when `own` is not a pod's work dir name. Pure."""
    mine = WORK_NAME.fullmatch(own)
    if mine is None:
        return []
    return sorted(n for n in names if n != own and (m := WORK_NAME.fullmatch(n)) is not None
                  and m.group(1) == mine.group(1))


class StaleWork:
    """Removes this writer's stale work dirs from the volume root `root`;
    `failed()` is called once for each dir that could not (fully) go."""

    def __init__(self, root: Path, own: Path, failed: Callable[[], None]) -> None:
        self.root, self.own, self.failed = root, Path(own).name, failed
        self._reported: set[str] = set()
        # Only a dir already here when this agent started can be an earlier
        # pod's. One that appears later is a newer pod's: a replacement that
        # starts while this pod terminates, its agent still holding the lease.
        try:
            self._earlier = set(self._names())
        except OSError:
            self._earlier = set()

    def _names(self) -> list[str]:
        return [e.name for e in os.scandir(self.root) if e.is_dir(follow_symlinks=False)
                or e.is_symlink()]

    def prune(self) -> list[str]:
        """Remove what `stale` names among the dirs that were here when this
        agent started; the names removed entirely."""
        try:
            names = [n for n in self._names() if n in self._earlier]
        except OSError as err:
            self._report(str(self.root), str(self.root), err)
            return []
        removed = []
        for name in stale(self.own, names):
            problems = workdir.remove_tree(self.root / name)
            if problems:
                self._report(name, *problems[0])
            else:
                removed.append(name)
                self._reported.discard(name)
        if removed:
            log.info("removed work dirs of earlier pods of this writer: %s", removed)
        return removed

    def _report(self, key: str, path: str, err: OSError) -> None:
        if key in self._reported:
            return
        self._reported.add(key)
        self.failed()
        log.warning("cannot remove an earlier pod's work dir: %s: %s (errno %s); the "
                    "trainer's files must be removable by the pod's group; will retry",
                    path, err.strerror or err, err.errno)
