"""The collector's scan on a real directory tree, without mounts or an
apiserver (a dict stands in; tests/cluster/test_csi_gc_apiserver.py has both):
what it deletes, what it never touches, and how it measures."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptdrain.csi.collection import DELETE, RETAIN, Reclaim, Verdict
from ckptdrain.csi.collector import DELETED_SINCE_FILE, TRASH_DIR, Collector
from ckptdrain.csi.requests import Refused
from ckptdrain.csi.usage import measure
from ckptdrain.csi.volumes import Owner, PolicyFound, VolumeStore

UID = "11111111-1111-4111-8111-111111111111"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def policy_dir(root: Path, namespace: str = "team-a", uid: str = UID) -> Path:
    directory = root / namespace / uid
    (directory / "data").mkdir(parents=True)
    (directory / "owner.json").write_text(Owner(namespace, uid, "ckpt", 2000).to_json())
    (directory / "data" / "step-1.bin").write_bytes(b"x" * 10_000)
    return directory


def collector(root: Path, answers: dict[tuple[str, str], object], clock: Clock,
              policy: str = DELETE, mounted: set[Path] | None = None) -> Collector:
    def resolve(namespace: str, name: str) -> PolicyFound | None:
        answer = answers.get((namespace, name))
        if isinstance(answer, Refused):
            raise answer
        return None if answer is None else PolicyFound(answer, None)

    store = VolumeStore(root, resolve, mounter=None)  # type: ignore[arg-type]
    return Collector(store, resolve, Reclaim(policy, 60.0), 1.0,
                     lambda d: d in (mounted or set()), clock=clock)


def test_a_deleted_policys_dir_goes_after_the_grace_and_a_restart_keeps_the_clock(
        tmp_path: Path) -> None:
    directory = policy_dir(tmp_path)
    clock = Clock()
    collector(tmp_path, {}, clock).scan()
    assert json.loads((directory / DELETED_SINCE_FILE).read_text()) == \
        {"since": 1000.0, "last": 1000.0}
    clock.now += 59
    assert collector(tmp_path, {}, clock).scan().policies[0].verdict is Verdict.PENDING
    clock.now += 1
    fresh = collector(tmp_path, {}, clock)  # a restarted driver: a new collector
    report = fresh.scan()
    assert not directory.exists() and report.policies == [] and fresh.deletions == 1
    assert list((tmp_path / TRASH_DIR).iterdir()) == []


def test_an_odd_answer_keeps_the_clock_and_a_present_owner_stops_it(tmp_path: Path) -> None:
    directory = policy_dir(tmp_path)
    clock = Clock()
    collector(tmp_path, {}, clock).scan()
    clock.now += 3600
    odd = {("team-a", "ckpt"): Refused("UNAVAILABLE", "HTTP 403 Forbidden")}
    assert collector(tmp_path, odd, clock).scan().policies[0].verdict is Verdict.PENDING
    assert (directory / DELETED_SINCE_FILE).is_file()
    back = collector(tmp_path, {("team-a", "ckpt"): UID}, clock).scan()
    assert back.policies[0].verdict is Verdict.LIVE
    assert not (directory / DELETED_SINCE_FILE).exists()


def test_retain_a_mount_and_a_publish_record_each_keep_the_data(tmp_path: Path) -> None:
    directory = policy_dir(tmp_path)
    clock = Clock()
    for make in (lambda: collector(tmp_path, {}, clock, policy=RETAIN),
                 lambda: collector(tmp_path, {}, clock, mounted={directory})):
        make().scan()
        clock.now += 60
        assert make().scan().policies[0].verdict in (Verdict.RETAINED, Verdict.PENDING)
        assert directory.is_dir()
    published = tmp_path / ".published"
    published.mkdir()
    (published / "csi-1.json").write_text(json.dumps(
        {"targetPath": "/pods/x/mount", "source": str(directory / "data")}))
    clock.now += 60
    assert collector(tmp_path, {}, clock).scan().policies[0].verdict is Verdict.PENDING
    (published / "csi-1.json").unlink()
    collector(tmp_path, {}, clock).scan()
    assert not directory.exists()


def test_links_and_unknown_owners_are_never_followed_or_deleted(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"p" * 50_000)
    # A link where a policy dir would be, to a dir with a valid-looking marker.
    (outside / "owner.json").write_text(Owner("team-a", UID, "ckpt").to_json())
    (root / "team-a").mkdir(parents=True)
    (root / "team-a" / UID).symlink_to(outside)
    # A real policy dir whose tenant linked its data to the outside dir.
    other = "22222222-2222-4222-8222-222222222222"
    directory = policy_dir(root, uid=other)
    (directory / "data" / "escape").symlink_to(outside)
    (root / "team-b" / "no-marker" / "data").mkdir(parents=True)
    clock = Clock()
    first = collector(root, {}, clock).scan()
    assert first.unknown_owners == 2  # the link and the dir without a marker
    # Usage counts the link itself, not what it points at.
    [seen] = first.policies
    assert seen.usage is not None and seen.usage.bytes < 50_000
    clock.now += 60
    collector(root, {}, clock).scan()
    assert not directory.exists()  # deleted, its link with it...
    assert (outside / "precious").read_bytes() == b"p" * 50_000  # ...not what it named
    assert (root / "team-a" / UID).is_symlink()
    assert (root / "team-b" / "no-marker" / "data").is_dir()


def test_usage_counts_blocks_once_per_inode(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(os.urandom(64 * 1024))
    os.link(tmp_path / "a", tmp_path / "b")
    (tmp_path / "sub").mkdir()
    usage = measure(tmp_path)
    assert 64 * 1024 <= usage.bytes < 2 * 64 * 1024
    assert usage.inodes == 3  # the dir, the file (two names), sub


@pytest.mark.parametrize("name", [".new-123", ".mount-x"])
def test_staging_dirs_are_left_to_their_maker(tmp_path: Path, name: str) -> None:
    (tmp_path / "team-a" / name).mkdir(parents=True)
    report = collector(tmp_path, {}, Clock()).scan()
    assert report.unknown_owners == 0 and (tmp_path / "team-a" / name).is_dir()


def test_a_silence_longer_than_the_grace_starts_the_clock_again(tmp_path: Path) -> None:
    """Seen deleted, then only odd answers for longer than the grace, then
    deleted again: the owner was not seen deleted all along, so the grace
    counts from the new sighting."""
    directory = policy_dir(tmp_path)
    clock = Clock()
    collector(tmp_path, {}, clock).scan()  # seen deleted: the clock starts
    odd = {("team-a", "ckpt"): Refused("UNAVAILABLE", "HTTP 404 Not Found")}
    for _ in range(3):
        clock.now += 30
        assert collector(tmp_path, odd, clock).scan().policies[0].verdict is Verdict.PENDING
    clock.now += 30  # 120 s since the last definite answer, grace 60 s
    assert collector(tmp_path, {}, clock).scan().policies[0].verdict is Verdict.PENDING
    assert directory.is_dir()
    clock.now += 59
    assert collector(tmp_path, {}, clock).scan().policies[0].verdict is Verdict.PENDING
    clock.now += 1  # seen deleted at the start of the grace and now, no long gap
    collector(tmp_path, {}, clock).scan()
    assert not directory.exists()


def test_a_linked_trash_is_never_renamed_into(tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "root"
    directory = policy_dir(root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / TRASH_DIR).symlink_to(elsewhere)
    clock = Clock()
    collector(root, {}, clock).scan()
    clock.now += 60
    with caplog.at_level(logging.ERROR, logger="ckptdrain.csi.collector"):
        report = collector(root, {}, clock).scan()
    # Kept where it is, reported as waiting, and nothing landed elsewhere.
    assert (directory / "data" / "step-1.bin").is_file()
    assert [p.verdict for p in report.policies] == [Verdict.PENDING]
    assert list(elsewhere.iterdir()) == []
    assert any("not a directory" in r.getMessage() for r in caplog.records)


def test_an_unreadable_namespace_holds_up_none_of_the_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root reads any mode, so the namespace dir is made unreadable by
    making its listing fail, as an I/O error or a stale handle would."""
    policy_dir(tmp_path, namespace="team-a")
    other = "22222222-2222-4222-8222-222222222222"
    policy_dir(tmp_path, namespace="team-b", uid=other)
    listing = Path.iterdir

    def iterdir(path: Path):  # type: ignore[no-untyped-def]
        if path == tmp_path / "team-a":
            raise PermissionError(13, "Permission denied", str(path))
        return listing(path)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    report = collector(tmp_path, {("team-b", "ckpt"): other}, Clock()).scan()
    assert [(p.namespace, p.verdict) for p in report.policies] == [("team-b", Verdict.LIVE)]
    assert report.capacity is not None


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0,
                    reason="mounts a tmpfs: Linux, as root (as the driver runs)")
def test_a_mount_left_in_the_trash_is_not_entered(tmp_path: Path) -> None:
    """A filesystem still mounted inside a deleted directory (a crash
    mid-unpublish): its files are not the directory's to delete."""
    root = tmp_path / "root"
    left = root / TRASH_DIR / "team-a-x" / "data"
    (left / "mnt").mkdir(parents=True)
    (left / "step-1.bin").write_bytes(b"x")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(left / "mnt")],
                   check=True)
    try:
        (left / "mnt" / "precious").write_bytes(b"p")
        collector(root, {}, Clock()).scan()
        assert (left / "mnt" / "precious").read_bytes() == b"p"
    finally:
        subprocess.run(["umount", str(left / "mnt")], check=True)
    # Unmounted, the next scan empties the trash.
    collector(root, {}, Clock()).scan()
    assert list((root / TRASH_DIR).iterdir()) == []


def test_a_failing_after_scan_hook_is_logged_and_the_scans_go_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The hook (the free-space publisher) meeting something unforeseen (a
    credentials or SDK error) must not end the scan thread for good."""
    import threading

    calls: list[object] = []
    twice = threading.Event()

    def hook(report: object) -> None:
        calls.append(report)
        if len(calls) >= 2:
            twice.set()
        raise TypeError("an SDK surprise")

    def resolve(namespace: str, name: str) -> PolicyFound | None:
        return None

    store = VolumeStore(tmp_path, resolve, mounter=None)  # type: ignore[arg-type]
    scans = Collector(store, resolve, Reclaim(DELETE, 60.0), 0.01, lambda d: False,
                      after_scan=hook)
    with caplog.at_level(logging.ERROR, "ckptdrain.csi.collector"):
        scans.start()
        try:
            assert twice.wait(timeout=30), "the scans ended after the hook failed"
            assert scans.alive()
        finally:
            scans.stop()
    assert any("TypeError" in r.getMessage() and "an SDK surprise" in r.getMessage()
               for r in caplog.records), caplog.text
