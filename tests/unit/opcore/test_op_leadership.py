"""leadership.is_active mirrors Kopf's peering rule: paused while another
live peer has a higher or equal priority; dead peers and ourselves ignored."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ckptdrain.operator.apiserver.leadership import _priority, is_active

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def peer(priority: int, seen_ago_s: float = 1, lifetime: int = 60) -> dict:
    return {"priority": priority, "lifetime": lifetime,
            "lastseen": (NOW - timedelta(seconds=seen_ago_s)).isoformat()}


def test_alone_or_without_peering_is_active() -> None:
    assert is_active(None, "me", 5, NOW)
    assert is_active({}, "me", 5, NOW)
    assert is_active({"me": peer(5)}, "me", 5, NOW)


def test_a_live_higher_peer_pauses_us_and_a_lower_one_does_not() -> None:
    assert not is_active({"me": peer(5), "other": peer(9)}, "me", 5, NOW)
    assert is_active({"me": peer(5), "other": peer(2)}, "me", 5, NOW)


def test_a_tie_pauses_both_as_kopf_does() -> None:
    assert not is_active({"me": peer(5), "other": peer(5)}, "me", 5, NOW)


def test_a_dead_higher_peer_is_ignored() -> None:
    assert is_active({"other": peer(9, seen_ago_s=61)}, "me", 5, NOW)
    assert not is_active({"other": peer(9, seen_ago_s=59)}, "me", 5, NOW)


def test_missing_fields_count_as_kopf_counts_them() -> None:
    # No lastseen: seen now (alive); no lifetime: 60 s; Zulu time parses.
    assert not is_active({"other": {"priority": 9}}, "me", 5, NOW)
    zulu = (NOW - timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert not is_active({"other": {"priority": 9, "lastseen": zulu}}, "me", 5, NOW)
    assert is_active({"other": "garbage"}, "me", 5, NOW)


def test_a_set_priority_is_used_and_a_bad_one_named() -> None:
    assert _priority("7") == 7
    assert 1 <= _priority(None) < 2**31 and 1 <= _priority("") < 2**31
    for bad in ("0", "-1", "x", "2147483648", "٣"):
        with pytest.raises(ValueError, match="CKPTDRAIN_PEERING_PRIORITY"):
            _priority(bad)


def test_a_new_term_resets_before_active_answers_true() -> None:
    from ckptdrain.operator.apiserver.leadership import Leadership
    state = Leadership()
    seen: list[bool] = []
    state.on_new_term(lambda: seen.append(state.active()))
    state.set(True)  # already active: no new term
    assert seen == []
    state.set(False)
    state.set(False)
    assert seen == []
    state.set(True)
    assert seen == [False] and state.active()  # the reset ran while still inactive
    state.set(True)
    assert seen == [False]


def test_work_started_at_a_new_term_finds_the_replica_active_after_the_resets() -> None:
    from ckptdrain.operator.apiserver.leadership import Leadership
    state = Leadership()
    seen: list[str] = []
    state.on_term_started(lambda: seen.append(f"started, active={state.active()}"))
    state.on_new_term(lambda: seen.append("reset"))
    state.set(False)
    assert seen == []
    state.set(True)
    assert seen == ["reset", "started, active=True"]
    state.set(True)
    assert seen == ["reset", "started, active=True"]
