"""The policy admission's free-space warning (admission/node_room.py and
its cached read, node_room_read.py): what one writer needs, which reports
count, and when the warning is said."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.contract.csi import CAPACITY_MAX_REFRESH_S
from ckptdrain.csi import capacity_report
from ckptdrain.csi.usage import Capacity
from ckptdrain.operator.admission import node_room, node_room_read
from ckptdrain.operator.admission.node_room import (
    CAPACITY_FIELD,
    SIZING_FIELDS,
    Need,
    Report,
    need_of,
    report_of,
    warning,
)
from ckptdrain.operator.apiserver import reads as apiserver_reads
from ckptdrain.operator.config import OperatorConfig

GB = 10**9
NOW = 1_800_000_000.0
CSI = OperatorConfig(image="ckptdrain:1", node_tier="csi", csi_capacity_namespace="ckptdrain")


def spec(**local: Any) -> dict[str, Any]:
    return {"selector": {"matchLabels": {"app": "a"}}, "model": {"checkpointBytes": "80GB"},
            "interval": "15m", "writers": 8,
            "localTier": {"path": "/mnt/ckptdrain", "keep": 2, **local},
            "storage": {"uri": "s3://ckpt-bucket/runs"}}


def fresh(node: str, available: int) -> Report:
    return Report(node, available, NOW - 60, 600)


def test_a_writer_needs_the_capacity_when_set_else_what_the_agent_keeps() -> None:
    # 80 GB over 8 writers: 10 GB a shard. The work dir on the tier's disk:
    # keep 2, the one being captured, the trainer's next save and the step
    # restore placed (docs/pod-contract.md); in memory, keep 2, the capture
    # and the SIGTERM capture's room (contract/tier_reserve.py reserve_steps).
    assert need_of(spec(), "ns", "p", CSI) == Need(50 * GB, SIZING_FIELDS, 5, 3, True)
    in_memory = spec(memory={"sizeLimit": "20GB"})
    assert need_of(in_memory, "ns", "p", CSI) == Need(40 * GB, SIZING_FIELDS, 4, 2)
    assert need_of(spec(capacity="45GB"), "ns", "p", CSI) == Need(45 * GB, CAPACITY_FIELD)
    assert need_of({"writers": "many"}, "ns", "p", CSI) is None


def test_no_node_with_room_warns_with_the_need_the_largest_and_the_count() -> None:
    said = warning(Need(45 * GB, CAPACITY_FIELD),
                   [fresh("gpu-1", 20 * GB), fresh("gpu-2", 44 * GB)], NOW)
    assert said is not None
    assert "spec.localTier.capacity" in said and "45.0 GB" in said
    assert "2 nodes report at most 44.0 GB free (gpu-2)" in said, said


def test_the_sizing_is_named_when_no_capacity_is_set() -> None:
    said = warning(Need(50 * GB, SIZING_FIELDS, 5, 3, True), [fresh("gpu-1", GB)], NOW)
    assert said is not None and "spec.localTier.keep" in said
    assert "the 1 node reporting has 1.00 GB free (gpu-1)" in said, said
    assert "5 shards, work dir on disk" in said, said
    # With localTier.memory the work dir is not on the disk: not said.
    in_memory = need_of(spec(memory={"sizeLimit": "20GB"}), "ns", "p", CSI)
    assert in_memory is not None
    said = warning(in_memory, [fresh("gpu-1", GB)], NOW)
    assert said is not None and "keep + 2 = 4 shards)" in said, said


def test_a_warning_stays_short_whatever_the_numbers_and_names() -> None:
    """kubectl prints it on every write: at most WARNING_CHARS characters."""
    need = Need(123_456 * 10**12, SIZING_FIELDS, 1003, 3, True)
    for count in (1, 10_000):
        reports = [fresh(f"{i}-" + "n" * 300, 999 * 10**12) for i in range(count)]
        said = warning(need, reports, NOW)
        assert said is not None and len(said) <= node_room.WARNING_CHARS, (len(said), said)


def test_one_node_with_room_or_exactly_room_says_nothing() -> None:
    assert warning(Need(45 * GB, CAPACITY_FIELD),
                   [fresh("gpu-1", 20 * GB), fresh("gpu-2", 45 * GB)], NOW) is None


def test_no_reports_or_only_stale_ones_say_nothing() -> None:
    assert warning(Need(45 * GB, CAPACITY_FIELD), [], NOW) is None
    stale = Report("gpu-1", GB, NOW - 2 * 600 - 1, 600)
    assert warning(Need(45 * GB, CAPACITY_FIELD), [stale], NOW) is None
    # A stale node with room does not hide a fresh one without.
    roomy_but_stale = Report("gpu-9", 100 * GB, NOW - 2 * 600 - 1, 600)
    said = warning(Need(45 * GB, CAPACITY_FIELD), [roomy_but_stale, fresh("gpu-1", GB)], NOW)
    assert said is not None and "the 1 node reporting has" in said


def test_a_report_from_the_future_or_with_an_overlong_refresh_is_not_fresh() -> None:
    """Two wall clocks meet here: a driver's clock far ahead would keep its
    report fresh for ever, and so would a refresh period no driver writes."""
    need = Need(45 * GB, CAPACITY_FIELD)
    ahead = Report("gpu-1", GB, NOW + node_room.FUTURE_SKEW_S + 1, 600)
    assert warning(need, [ahead], NOW) is None
    slightly_ahead = Report("gpu-1", GB, NOW + node_room.FUTURE_SKEW_S, 600)
    assert warning(need, [slightly_ahead], NOW) is not None
    endless = Report("gpu-1", GB, NOW - 2 * CAPACITY_MAX_REFRESH_S - 1, 10**9)
    assert warning(need, [endless], NOW) is None
    # A driver scanning hourly writes a two-hour period, believed as said.
    hourly = Report("gpu-1", GB, NOW - 3 * 3600, 7200)
    assert warning(need, [hourly], NOW) is not None
    for absurd in (float("nan"), float("inf")):
        assert warning(need, [Report("gpu-1", GB, NOW - 2 * CAPACITY_MAX_REFRESH_S - 1,
                                     absurd)], NOW) is None


@given(st.integers(0, 10**14), st.lists(st.integers(0, 10**14), max_size=5),
       st.floats(0, 5000))
def test_a_warning_exactly_when_every_fresh_report_is_short(
        need: int, free: list[int], age: float) -> None:
    reports = [Report(f"n{i}", f, NOW - age, 600) for i, f in enumerate(free)]
    said = warning(Need(need, CAPACITY_FIELD), reports, NOW)
    # Two refresh periods old (as the clock's arithmetic has it) still counts.
    counted = NOW - (NOW - age) <= 2 * 600 and free
    assert (said is not None) == bool(counted and max(free) < need)


def test_the_drivers_own_object_reads_back_as_its_report() -> None:
    obj = capacity_report.build("gpu-1", "node.ckptdrain.io", "ckptdrain",
                                Capacity(44 * GB, 100 * GB, 1, 1), NOW, 600)
    assert report_of(obj) == Report("gpu-1", 44 * GB, NOW, 600)
    # The apiserver writes quantities back in their canonical form.
    assert report_of({**obj, "capacity": "44G"}) == Report("gpu-1", 44 * GB, NOW, 600)
    assert report_of({**obj, "storageClassName": "fast-ssd"}) is None
    assert report_of({**obj, "capacity": "lots"}) is None


def test_an_update_warns_only_when_the_need_changes() -> None:
    changed = node_room_read.need_changed
    assert changed(spec(), None, "ns", "p", CSI)
    assert not changed({**spec(), "interval": "20m"}, spec(), "ns", "p", CSI)
    assert changed(spec(keep=3), spec(), "ns", "p", CSI)
    assert changed(spec(capacity="45GB"), spec(), "ns", "p", CSI)
    # hostPath mode parses nothing and warns of nothing.
    hostpath = OperatorConfig(image="ckptdrain:1", csi_capacity_namespace="ckptdrain")
    assert not changed(spec(), None, "ns", "p", hostpath)


def test_one_list_serves_a_burst_and_a_failed_one_says_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    listed: list[str] = []
    obj = capacity_report.build("gpu-1", "node.ckptdrain.io", "ckptdrain",
                                Capacity(GB, 100 * GB, 1, 1), time.time(), 600)

    def get_json(path: str, query: list[tuple[str, str]], timeout: float) -> dict[str, Any]:
        listed.append(path)
        if len(listed) > 1:
            raise apiserver_reads.ApiError(403, "Forbidden", "no")
        assert query == [("labelSelector", "ckptdrain.io/csi-driver=node.ckptdrain.io")]
        return {"items": [obj]}

    monkeypatch.setattr(apiserver_reads, "get_json", get_json)
    clock = [0.0]
    cache = node_room_read.ReportCache(clock=lambda: clock[0])

    def ask(**local: Any) -> str | None:
        return asyncio.run(node_room_read.room_warning(
            spec(**local), "ns", "p", CSI, time.monotonic() + 3, cache))

    assert ask() is not None and ask(capacity="1GB") is None
    assert listed == ["/apis/storage.k8s.io/v1/namespaces/ckptdrain/csistoragecapacities"]
    clock[0] += node_room_read.CACHE_S
    assert ask() is None  # the list refused: nothing said
    assert len(listed) == 2
    # hostPath mode never reads.
    hostpath = OperatorConfig(image="ckptdrain:1", csi_capacity_namespace="ckptdrain")
    assert asyncio.run(node_room_read.room_warning(spec(), "ns", "p", hostpath, 0, cache)) \
        is None
    assert len(listed) == 2


def test_admissions_waiting_on_a_slow_list_each_keep_their_own_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Admissions arriving together share one LIST, and none waits on it past
    its own budget (queued, they would add up past the webhook's timeout):
    all three have their answer while the LIST is still running."""
    listed: list[float] = []
    released, finished = threading.Event(), threading.Event()

    def slow_get_json(path: str, query: list[tuple[str, str]], timeout: float) -> Any:
        listed.append(timeout)
        released.wait(timeout)  # an apiserver that answers nothing in time
        finished.set()
        raise apiserver_reads.ApiError(504, "Gateway Timeout", "slow")

    monkeypatch.setattr(apiserver_reads, "get_json", slow_get_json)
    cache = node_room_read.ReportCache()

    async def admission(i: int) -> str | None:
        return await node_room_read.room_warning(spec(), "ns", f"p{i}", CSI,
                                                 time.monotonic() + 0.2, cache)

    async def burst() -> list[str | None]:
        said = list(await asyncio.gather(*(admission(i) for i in range(3))))
        running = not finished.is_set()
        released.set()
        assert running, "an admission waited for the LIST past its budget"
        return said

    assert asyncio.run(burst()) == [None, None, None]
    assert len(listed) == 1


def test_a_late_admission_lists_for_everyone_with_a_full_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An admission with almost no budget left starts the LIST, which runs
    with the whole read budget: its outcome, kept for the next admissions,
    is the apiserver's answer, never a timeout of the late one's leftovers."""
    listed: list[float] = []
    obj = capacity_report.build("gpu-1", "node.ckptdrain.io", "ckptdrain",
                                Capacity(GB, 100 * GB, 1, 1), time.time(), 600)

    def get_json(path: str, query: list[tuple[str, str]], timeout: float) -> Any:
        listed.append(timeout)
        if timeout < 1.0:  # what a LIST given 10 ms gets from a busy apiserver
            raise apiserver_reads.HTTPError("read timed out")
        return {"items": [obj]}

    monkeypatch.setattr(apiserver_reads, "get_json", get_json)
    cache = node_room_read.ReportCache()

    async def late_then_on_time() -> str | None:
        await node_room_read.room_warning(spec(), "ns", "late", CSI,
                                          time.monotonic() + 0.01, cache)
        return await node_room_read.room_warning(spec(), "ns", "p", CSI,
                                                 time.monotonic() + 3, cache)

    assert asyncio.run(late_then_on_time()) is not None
    assert len(listed) == 1


def test_a_failed_list_is_kept_briefly_so_a_burst_does_not_list_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    listed: list[str] = []

    def refused(path: str, query: list[tuple[str, str]], timeout: float) -> Any:
        listed.append(path)
        raise apiserver_reads.ApiError(403, "Forbidden", "no")

    monkeypatch.setattr(apiserver_reads, "get_json", refused)
    clock = [0.0]
    cache = node_room_read.ReportCache(clock=lambda: clock[0])
    for _ in range(3):
        assert reports_now(cache) is None
    assert len(listed) == 1
    clock[0] += node_room_read.FAILED_CACHE_S
    assert reports_now(cache) is None
    assert len(listed) == 2


def reports_now(cache: node_room_read.ReportCache, budget: float = 3) -> Any:
    return asyncio.run(cache.reports("ckptdrain", "node.ckptdrain.io",
                                     time.monotonic() + budget))


def test_a_class_filled_policy_warns_on_an_update_only_when_its_need_changes(
        monkeypatch: pytest.MonkeyPatch, no_checkpoint_classes: Any) -> None:
    """The spec compared is the one the class fills in (here its Secret,
    without which the caBundle does not parse), as the admission judges it."""
    from ckptdrain.operator.admission import policy_rules

    no_checkpoint_classes.replace([{
        "apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointClass",
        "metadata": {"name": "keyed", "resourceVersion": "2"},
        "spec": {"nodeTier": {"root": "/mnt/ckptdrain"},
                 "credentialsSecretRef": {"name": "tenant-keys"}}}], "2")
    obj = capacity_report.build("gpu-1", "node.ckptdrain.io", "ckptdrain",
                                Capacity(GB, 100 * GB, 1, 1), time.time(), 600)
    monkeypatch.setattr(apiserver_reads, "get_json", lambda *_: {"items": [obj]})
    monkeypatch.setattr(node_room_read, "CACHE", node_room_read.ReportCache())

    def policy(**changed: Any) -> dict[str, Any]:
        given = {**spec(), "checkpointClassName": "keyed", **changed}
        given["storage"] = {**given["storage"], "caBundle": {
            "configMapKeyRef": {"name": "ca", "key": "ca.crt"}}}
        return {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointPolicy",
                "metadata": {"name": "p", "namespace": "ns"}, "spec": given}

    def warned(new: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
        said: list[str] = []
        asyncio.run(policy_rules.admit_policy(new, old, "ns", CSI, warnings=said))
        return said

    assert len(warned(policy(interval="20m"), policy())) == 0
    assert len(warned(policy(writers=4), policy())) == 1


def test_with_the_reports_unread_an_update_resolves_no_old_class(
        monkeypatch: pytest.MonkeyPatch, no_checkpoint_classes: Any) -> None:
    """Resolving the old spec's class may read its namespace's labels: a
    read made only for the warning, so none when the reports are not read."""
    from ckptdrain.operator.admission import policy_rules

    resolved: list[Mapping[str, Any]] = []
    real = policy_rules._class_of

    async def counted(given: Mapping[str, Any], *args: Any) -> Any:
        resolved.append(given)
        return await real(given, *args)

    monkeypatch.setattr(policy_rules, "_class_of", counted)
    monkeypatch.setattr(apiserver_reads, "get_json", lambda *_: {"items": []})
    monkeypatch.setattr(node_room_read, "CACHE", node_room_read.ReportCache())

    def policy(**changed: Any) -> dict[str, Any]:
        return {"apiVersion": "ckptdrain.io/v1beta1", "kind": "CheckpointPolicy",
                "metadata": {"name": "p", "namespace": "ns"}, "spec": {**spec(), **changed}}

    unread = OperatorConfig(image="ckptdrain:1", node_tier="csi")
    asyncio.run(policy_rules.admit_policy(policy(keep=3), policy(), "ns", unread,
                                          warnings=[]))
    assert len(resolved) == 1  # the new spec's, which admission judges
    asyncio.run(policy_rules.admit_policy(policy(keep=3), policy(), "ns", CSI, warnings=[]))
    assert len(resolved) == 3


def test_a_node_name_from_a_report_is_repeated_printable_and_short() -> None:
    said = warning(Need(45 * GB, CAPACITY_FIELD), [fresh("gpu-1\x1b[2J\n" + "x" * 300, GB)], NOW)
    assert said is not None and "\x1b" not in said and "\n" not in said
    assert "x" * 100 not in said and "gpu-1[2J" in said


def test_a_budget_spent_before_the_list_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    listed: list[str] = []

    def get_json(path: str, query: list[tuple[str, str]], timeout: float) -> Any:
        listed.append(path)
        return {"items": []}

    monkeypatch.setattr(apiserver_reads, "get_json", get_json)
    cache = node_room_read.ReportCache()
    assert reports_now(cache, -1) is None
    assert listed == []
    assert reports_now(cache) == []
    assert len(listed) == 1
