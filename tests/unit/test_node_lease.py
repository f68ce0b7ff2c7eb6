"""node/lease.py: who may take a writer's lease, and the spec written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ckptdrain.node.lease import MICROTIME, lease_name, lease_spec, may_take

NOW = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def held_by(holder: str, renewed: datetime, seconds: int = 60) -> dict[str, object]:
    return lease_spec(holder, seconds, renewed)


def test_free_own_or_stale_leases_may_be_taken() -> None:
    assert may_take({}, "me", NOW)
    assert may_take(held_by("me", NOW), "me", NOW)
    assert not may_take(held_by("other", NOW - timedelta(seconds=59)), "me", NOW)
    assert may_take(held_by("other", NOW - timedelta(seconds=61)), "me", NOW)
    # Written by another client with whole seconds, or without a duration.
    assert not may_take({"holderIdentity": "other", "renewTime": "2026-01-02T03:04:00Z",
                         "leaseDurationSeconds": 60}, "me", NOW)
    assert may_take({"holderIdentity": "other", "renewTime": "garbage"}, "me", NOW)


def test_spec_keeps_the_acquire_time_on_renewal() -> None:
    first = lease_spec("me", 60, NOW)
    later = lease_spec("me", 60, NOW + timedelta(seconds=20), str(first["acquireTime"]))
    assert later["acquireTime"] == NOW.strftime(MICROTIME) == "2026-01-02T03:04:05.678901Z"
    assert later["renewTime"] != first["renewTime"]


def test_names_are_per_policy_and_writer_and_valid() -> None:
    assert lease_name("llama", 3) == "ckptdrain-llama-w3"
    assert lease_name("Odd_Name.x", 0) == "ckptdrain-odd-name-x-w0"
    assert len(lease_name("p" * 300, 12345)) <= 253
