"""The CSI driver's metrics registry (csi/metrics.py) over a real scan of a
real directory tree: what an alert can count on before the first scan has
ended and after it (tests/chart/test_csi_alerts.py checks that the rules
name only these series)."""

from __future__ import annotations

from pathlib import Path

from ckptdrain.csi.collection import DELETE, RETAIN, Reclaim
from ckptdrain.csi.collector import Collector
from ckptdrain.csi.metrics import registry_for
from ckptdrain.csi.volumes import Owner, PolicyFound, VolumeStore

LIVE_UID = "11111111-1111-4111-8111-111111111111"
GONE_UID = "22222222-2222-4222-8222-222222222222"
GONE_LATER_UID = "33333333-3333-4333-8333-333333333333"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def policy_dir(root: Path, uid: str, name: str, size: int) -> Path:
    directory = root / "team-a" / uid
    (directory / "data").mkdir(parents=True)
    (directory / "owner.json").write_text(Owner("team-a", uid, name, 2000).to_json())
    (directory / "data" / "step-1.bin").write_bytes(b"x" * size)
    return directory


def collector(root: Path, present: dict[str, str], clock: Clock, policy: str = DELETE,
              interval_s: float = 30.0) -> Collector:
    """A collector whose apiserver knows the policies in `present` (name -> UID)."""
    def resolve(namespace: str, name: str) -> PolicyFound | None:
        uid = present.get(name)
        return None if uid is None else PolicyFound(uid, None)

    store = VolumeStore(root, resolve, mounter=None)  # type: ignore[arg-type]
    return Collector(store, resolve, Reclaim(policy, 600.0), interval_s, lambda d: False,
                     clock=clock)


def samples(c: Collector) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in registry_for(c).collect() for s in family.samples}


def by_state(found: Samples, name: str) -> dict[str, float]:
    return {dict(labels)["state"]: value for (n, labels), value in found.items() if n == name}


def test_before_the_first_scan_only_the_start_and_the_interval_are_known(
        tmp_path: Path) -> None:
    clock = Clock()
    policy_dir(tmp_path, LIVE_UID, "live", 10_000)
    (tmp_path / "team-a" / "no-marker").mkdir()
    found = samples(collector(tmp_path, {"live": LIVE_UID}, clock, interval_s=45.0))
    assert found[("ckptdrain_csi_started_timestamp_seconds", ())] == 5000.0
    assert found[("ckptdrain_csi_scan_interval_seconds", ())] == 45.0
    # No zeros that would read as "no unknown owners" or "an empty disk".
    names = {name for name, _ in found}
    assert not {n for n in names if n.startswith(("ckptdrain_csi_policy_",
                                                  "ckptdrain_csi_filesystem_"))}, names
    assert "ckptdrain_csi_last_scan_timestamp_seconds" not in names
    assert "ckptdrain_csi_oldest_pending_deletion_timestamp_seconds" not in names
    assert "ckptdrain_csi_earliest_pending_deletion_due_timestamp_seconds" not in names


def test_after_a_scan_dirs_and_their_bytes_are_counted_by_state(tmp_path: Path) -> None:
    clock = Clock()
    policy_dir(tmp_path, LIVE_UID, "live", 10_000)
    policy_dir(tmp_path, GONE_UID, "gone", 300_000)
    (tmp_path / "team-a" / "no-marker").mkdir()
    c = collector(tmp_path, {"live": LIVE_UID}, clock)
    clock.now = 5100.0
    c.scan()
    found = samples(c)
    assert by_state(found, "ckptdrain_csi_policy_dirs") == {
        "live": 1, "pending_deletion": 1, "retained": 0, "unknown_owner": 1}
    used = by_state(found, "ckptdrain_csi_policy_dirs_used_bytes")
    assert set(used) == {"live", "pending_deletion", "retained"}
    assert used["retained"] == 0
    assert 10_000 <= used["live"] < 100_000 < 300_000 <= used["pending_deletion"]
    assert found[("ckptdrain_csi_last_scan_timestamp_seconds", ())] == 5100.0
    assert found[("ckptdrain_csi_started_timestamp_seconds", ())] == 5000.0


def test_the_oldest_pending_deletion_keeps_its_first_sighting(tmp_path: Path) -> None:
    """Later scans, a second deleted policy and a restart leave the time the
    oldest pending directory's owner was first seen deleted as it was."""
    clock = Clock()
    policy_dir(tmp_path, GONE_UID, "gone", 1000)
    later = policy_dir(tmp_path, GONE_LATER_UID, "gone-later", 1000)
    present = {"gone-later": GONE_LATER_UID}
    c = collector(tmp_path, present, clock)
    clock.now = 5100.0
    c.scan()
    oldest = ("ckptdrain_csi_oldest_pending_deletion_timestamp_seconds", ())
    due = ("ckptdrain_csi_earliest_pending_deletion_due_timestamp_seconds", ())
    assert samples(c)[oldest] == 5100.0
    assert samples(c)[due] == 5100.0 + 600  # the driver's grace: no record
    del present["gone-later"]
    clock.now = 5300.0
    c.scan()
    assert samples(c)[oldest] == 5100.0
    clock.now = 5400.0
    restarted = collector(tmp_path, present, clock)
    restarted.scan()
    assert samples(restarted)[oldest] == 5100.0
    # The oldest goes after its grace (600 s); the other is the oldest now.
    clock.now = 5750.0
    restarted.scan()
    assert later.exists() and not (tmp_path / "team-a" / GONE_UID).exists()
    assert samples(restarted)[oldest] == 5300.0
    assert samples(restarted)[due] == 5300.0 + 600
    clock.now = 6000.0
    restarted.scan()
    assert oldest not in samples(restarted) and due not in samples(restarted)


def test_retained_data_is_not_pending(tmp_path: Path) -> None:
    clock = Clock()
    policy_dir(tmp_path, GONE_UID, "gone", 200_000)
    c = collector(tmp_path, {}, clock, policy=RETAIN)
    c.scan()
    found = samples(c)
    assert by_state(found, "ckptdrain_csi_policy_dirs")["retained"] == 1
    assert by_state(found, "ckptdrain_csi_policy_dirs_used_bytes")["retained"] >= 200_000
    assert "ckptdrain_csi_oldest_pending_deletion_timestamp_seconds" not in {
        n for n, _ in found}
