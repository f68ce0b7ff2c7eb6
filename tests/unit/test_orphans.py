"""Which uploads are a writer's orphans (transfer/orphans.py): the pure decision."""

from __future__ import annotations

from ckptdrain import keys
from ckptdrain.store.base import MultipartUpload
from ckptdrain.transfer.orphans import choose, sweep_grace

A = "0123456789abcdef"


def up(step: int, writer: int, uid: str, initiated: float | None = 0.0) -> MultipartUpload:
    return MultipartUpload(keys.data_key(step, writer, "w.bin", A), uid, initiated)


def test_only_the_writers_own_unowned_uploads_are_orphans() -> None:
    mine_old, mine_owned = up(1, 3, "a"), up(2, 3, "b")
    other_writer, not_data = up(1, 4, "c"), MultipartUpload("manifests/x", "d", 0.0)
    format1 = MultipartUpload(keys.data_key(5, 3, "w.bin", None), "e", 0.0)
    chosen = choose([mine_old, mine_owned, other_writer, not_data, format1], writer=3,
                    owned={(mine_owned.key, "b")}, now=1000.0, grace=0.0)
    assert chosen == [mine_old, format1]


def test_while_a_predecessor_may_still_flush_young_uploads_are_spared() -> None:
    young, old, unknown = up(1, 0, "y", 950.0), up(1, 0, "o", 100.0), up(1, 0, "u", None)
    assert choose([young, old, unknown], 0, set(), now=1000.0, grace=300.0) == [old]
    assert choose([young, old, unknown], 0, set(), now=1000.0, grace=0.0) == [young, old, unknown]


def test_the_grace_ends_once_the_process_outlived_the_predecessors_window() -> None:
    assert sweep_grace(uptime=5.0, predecessor_grace=30.0) == float("inf")
    assert sweep_grace(uptime=31.0, predecessor_grace=30.0) == 0.0


def test_a_flushing_predecessor_keeps_its_old_uploads_whatever_their_age() -> None:
    # The predecessor's SIGTERM flush finishes the drain it had in flight: its
    # upload was started long before, and is in use until the predecessor ends.
    in_flight = up(100, 0, "p", initiated=1000.0 - 20 * 60)
    during = sweep_grace(uptime=5.0, predecessor_grace=30.0)
    assert choose([in_flight], 0, set(), now=1000.0, grace=during) == []
    after = sweep_grace(uptime=31.0, predecessor_grace=30.0)
    assert choose([in_flight], 0, set(), now=1000.0, grace=after) == [in_flight]
