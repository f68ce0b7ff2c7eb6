"""Restore (uid 65532, not root) makes the pod's own work dir in the node
tier's volume before the trainer's subPath mount, as the CSI driver leaves
that volume (`data/`: 65532, the first pod's group, 2770): the pod's group,
setgid, never through a symlink, never a dir someone else made; run again,
it keeps its own. Capture then links the trainer's files. Real files, real
users (forked children, tests/support/asuser.py)."""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.asuser import CKPTDRAIN_UID, TRAINER_UID, need_root, run_as

from ckptdrain.client import Client
from ckptdrain.node import config
from ckptdrain.node.linking import Methods
from ckptdrain.node.localtier import LocalTier
from ckptdrain.restore import pod_work
from ckptdrain.restore.engine import skip

#: The group the driver gave the policy's data (the first pod's fsGroup).
DATA_GROUP = 2000
#: Another pod's fsGroup.
OTHER_GROUP = 3000
POD_UID = "0f1e2d3c-4b5a-4697-8877-665544332211"
WORK = f"work-1-{POD_UID}"


def _no_reflink(_src: int, _dst: int) -> None:
    raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))


#: No reflink, whatever the filesystem under the test: the hard-link path.
NO_REFLINK = Methods(clone=_no_reflink)


@pytest.fixture
def data() -> Iterator[Path]:
    """The CSI driver's `data/` of a policy, as agent and restore mount it."""
    need_root()
    top = Path(tempfile.mkdtemp(prefix="ckptdrain-podwork-"))
    os.chmod(top, 0o755)
    volume = top / "data"
    volume.mkdir()
    os.chown(volume, CKPTDRAIN_UID, DATA_GROUP)
    os.chmod(volume, 0o2770)
    try:
        yield volume
    finally:
        shutil.rmtree(top)


def _restore(volume: Path, group: int, *, groups: tuple[int, ...] | None = None
             ) -> tuple[str, str]:
    """Restore's start as a fresh start (it empties, so makes, the work dir
    either way): the pod's writer 1 of 2, as the webhook configures it."""
    def run() -> tuple[str, str]:
        parser = argparse.ArgumentParser()
        config.add_arguments(parser)
        cfg = config.load(parser.parse_args([]), {
            "CKPTDRAIN_WORK_DIR": str(volume / WORK),
            "CKPTDRAIN_LOCAL_DIR": str(volume / "writer-1"),
            "CKPTDRAIN_TRAINER_WORK_DIR": "/ckptdrain/work",
            "CKPTDRAIN_WORK_GROUP": str(group), "CKPTDRAIN_WRITER_ID": "1",
            "CKPTDRAIN_WRITERS": "2"})
        result = skip(cfg)
        return result.outcome, result.reason
    return run_as(CKPTDRAIN_UID, run, groups=(group,) if groups is None else groups)


def _shape(path: Path) -> tuple[int, int, int]:
    found = os.lstat(path)
    return found.st_uid, found.st_gid, stat.S_IMODE(found.st_mode)


def test_restore_makes_the_work_dir_the_pods_group_setgid(data: Path) -> None:
    assert _restore(data, DATA_GROUP) == ("fresh_start", "skipped by annotation")
    assert _shape(data / WORK) == (CKPTDRAIN_UID, DATA_GROUP, 0o2775)

    def trainer_saves() -> int:
        client = Client(data / WORK)
        (client.begin(3) / "w.bin").write_bytes(b"w" * 100)
        client.complete(3)
        return os.stat(data / WORK / "step-3" / "w.bin").st_gid
    # A trainer of another uid writes in it; setgid keeps what it makes the group's.
    assert run_as(TRAINER_UID, trainer_saves, groups=(DATA_GROUP,)) == DATA_GROUP


def test_a_pod_with_another_fs_group_gets_its_own_group(data: Path) -> None:
    # Its trainer reaches the dir through its own subPath mount (the data dir's
    # group does not apply there): the dir itself must be its group's.
    assert _restore(data, OTHER_GROUP)[0] == "fresh_start"
    assert _shape(data / WORK) == (CKPTDRAIN_UID, OTHER_GROUP, 0o2775)
    assert _shape(data) == (CKPTDRAIN_UID, DATA_GROUP, 0o2770)


def test_a_group_restore_is_not_in_fails_naming_it(data: Path) -> None:
    outcome, reason = _restore(data, OTHER_GROUP, groups=(DATA_GROUP,))
    assert outcome == "cannot_place"
    assert f"group {OTHER_GROUP}" in reason and "CKPTDRAIN_WORK_GROUP" in reason


def test_restore_run_again_keeps_its_dir_and_empties_it(data: Path) -> None:
    _restore(data, DATA_GROUP)
    inode = os.stat(data / WORK).st_ino
    (data / WORK / "step-9").mkdir()  # what the pod's trainer left before a sandbox restart
    assert _restore(data, DATA_GROUP)[0] == "fresh_start"
    assert os.stat(data / WORK).st_ino == inode
    assert os.listdir(data / WORK) == []
    assert _shape(data / WORK) == (CKPTDRAIN_UID, DATA_GROUP, 0o2775)


def test_a_symlink_at_the_work_dirs_name_is_refused_not_followed(data: Path) -> None:
    elsewhere = data.parent / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    os.chown(elsewhere, CKPTDRAIN_UID, CKPTDRAIN_UID)
    (elsewhere / "keep").write_bytes(b"not the trainer's")
    (data / WORK).symlink_to(elsewhere)
    outcome, reason = _restore(data, DATA_GROUP)
    assert outcome == "cannot_place"
    assert f"{data / WORK} is a symlink" in reason
    assert _shape(elsewhere) == (CKPTDRAIN_UID, CKPTDRAIN_UID, 0o700)
    assert os.listdir(elsewhere) == ["keep"]


@pytest.mark.parametrize("kind", ["root's dir", "a file"])
def test_what_restore_did_not_make_is_refused(data: Path, kind: str) -> None:
    # kubelet makes a missing subPath as root, with the volume's mode.
    if kind == "a file":
        (data / WORK).write_bytes(b"x")
    else:
        (data / WORK).mkdir()
        os.chown(data / WORK, 0, DATA_GROUP)
        os.chmod(data / WORK, 0o2770)
        (data / WORK / "trainer.bin").write_bytes(b"x")
    outcome, reason = _restore(data, DATA_GROUP)
    assert outcome == "cannot_place"
    assert ("owned by uid 0" if kind == "root's dir" else "not a directory") in reason
    if kind == "root's dir":
        assert os.listdir(data / WORK) == ["trainer.bin"]
        assert _shape(data / WORK) == (0, DATA_GROUP, 0o2770)


def test_capture_links_the_trainers_files_in_the_drivers_layout(data: Path) -> None:
    _restore(data, DATA_GROUP)

    def trainer_saves() -> None:
        client = Client(data / WORK)
        (client.begin(5) / "model.bin").write_bytes(b"m" * 4096)
        client.complete(5)
    run_as(TRAINER_UID, trainer_saves, groups=(DATA_GROUP,))

    def agent_captures() -> dict[str, int]:
        tier = LocalTier(data / "writer-1", methods=NO_REFLINK)
        return tier.capture(data / WORK / "step-5", 5, writer=1, writers=2).methods
    assert run_as(CKPTDRAIN_UID, agent_captures, groups=(DATA_GROUP,))["link"] == 1
    taken = LocalTier(data / "writer-1").data_dir(5) / "model.bin"
    assert os.stat(taken).st_ino == os.stat(data / WORK / "step-5" / "model.bin").st_ino


@pytest.mark.parametrize(("work", "local", "own"), [
    (f"/v/{WORK}", "/v", True), (f"/v/{WORK}", "/v/writer-1", True),
    ("/ckptdrain/work", "/ckptdrain/local", False), (f"/elsewhere/{WORK}", "/v", False),
    ("/v/work-x-1", "/v", False), (f"/v/writer-1/{WORK}", "/v", False)])
def test_only_a_pods_dir_at_the_volume_root_is_made_so(work: str, local: str, own: bool) -> None:
    assert pod_work.is_pod_dir(Path(work), Path(local)) is own


def test_a_symlink_swapped_in_after_restore_made_the_dir_is_neither_emptied_nor_used(
        data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer's step, behind a symlink put at the work dir's name
    once restore checked the dir: it survives, and restore refuses."""
    other = data / "work-0-aa11"
    (other / "step-4").mkdir(parents=True)
    (other / "step-4" / "w.bin").write_bytes(b"writer 0's step")
    for made in (other, other / "step-4", other / "step-4" / "w.bin"):
        os.chown(made, CKPTDRAIN_UID, DATA_GROUP)  # as writer 0's restore made it
    checked = pod_work._own

    def then_swapped(work: Path, fd: int, group: int | None) -> None:
        checked(work, fd, group)
        os.rename(work, data / "moved")
        os.symlink(other, work)
    monkeypatch.setattr(pod_work, "_own", then_swapped)
    outcome, reason = _restore(data, DATA_GROUP)
    assert (other / "step-4" / "w.bin").read_bytes() == b"writer 0's step"
    assert outcome == "cannot_place" and "was replaced" in reason


def test_a_dir_whose_setgid_the_kernel_drops_is_refused(data: Path) -> None:
    """No CKPTDRAIN_WORK_GROUP: the dir inherits the volume's group, one this
    container is not in, and chmod 2775 leaves it without setgid."""
    def make() -> str:
        try:
            pod_work.make(data / WORK, None)
        except pod_work.ForeignWorkDir as err:
            return str(err)
        return ""
    refused = run_as(CKPTDRAIN_UID, make, groups=(OTHER_GROUP,))
    assert f"mode 0o775, expected 0o2775 (is this container in the group {DATA_GROUP}?)" \
        in refused
