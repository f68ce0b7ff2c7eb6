"""The bind mount's nosuid/nodev/ro reach the host's copy of the target, not
only the driver's: the driver runs in its own mount namespace, and kubelet
hands the pod the host's copy, propagated through the shared pods dir.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.csi_driver import mount_options

from ckptdrain.csi import mounts

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("unshare"),
    reason="needs Linux, root and unshare (real mounts in a child mount namespace)")


@pytest.fixture
def shared_pods_dir(tmp_path: Path) -> Iterator[Path]:
    """A pods dir shared with child namespaces, as the kubelet's is with the
    driver's pod (Bidirectional)."""
    pods = tmp_path / "pods"
    pods.mkdir()
    subprocess.run(["mount", "--bind", str(pods), str(pods)], check=True)
    try:
        subprocess.run(["mount", "--make-rshared", str(pods)], check=True)
        yield pods
    finally:
        subprocess.run(["umount", "-R", "-l", str(pods)], check=True)


def publish_in_child_namespace(source: Path, target: Path, read_only: bool) -> None:
    """mounts.bind, run as the driver runs it: in a mount namespace of its own."""
    program = ("import sys; from pathlib import Path; from ckptdrain.csi import mounts; "
               "mounts.bind(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == 'ro')")
    subprocess.run(["unshare", "-m", "--propagation", "unchanged", sys.executable, "-c",
                    program, str(source), str(target), "ro" if read_only else "rw"],
                   check=True, env={**os.environ})


@pytest.mark.parametrize("read_only", [False, True])
def test_the_hosts_copy_has_the_flags(tmp_path: Path, shared_pods_dir: Path,
                                      read_only: bool) -> None:
    source = tmp_path / "root" / "ns" / "uid" / "data"
    source.mkdir(parents=True)
    (source / "checkpoint").write_text("step 1")
    target = shared_pods_dir / "pod-uid" / "mount"
    target.mkdir(parents=True)

    publish_in_child_namespace(source, target, read_only)

    [options] = mount_options(target)  # this (the host's) namespace
    assert {"nosuid", "nodev", "ro" if read_only else "rw"} <= options
    assert (target / "checkpoint").read_text() == "step 1"
    # The staging point is gone, in the child and here.
    assert sorted(p.name for p in source.parent.iterdir()) == ["data"]
    mounts.unmount(target)
    assert not mounts.is_mount_point(target)
