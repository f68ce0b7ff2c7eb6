"""Owners read at admission: once per owner and uid within the TTL, one read
for concurrent admissions, never a failed read kept."""

from __future__ import annotations

import threading
import time
from typing import Any

from ckptdrain.operator.admission.owner_cache import OwnerCache


class Api:
    def __init__(self, delay: float = 0.0) -> None:
        self.objects: dict[str, dict[str, Any] | None] = {}
        self.asked: list[str] = []
        self.delay = delay

    def read(self, api_version: str, plural: str, namespace: str, name: str
             ) -> dict[str, Any] | None:
        self.asked.append(name)
        time.sleep(self.delay)
        return self.objects.get(name)


def job(name: str, uid: str, completions: int = 3) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid}, "spec": {"completions": completions}}


def test_one_read_per_owner_within_the_ttl() -> None:
    api, now = Api(), [0.0]
    api.objects["train"] = job("train", "u1")
    cache = OwnerCache(api.read, ttl=5.0, clock=lambda: now[0])
    for _ in range(100):  # a job of 100 pods admitted
        assert cache.get("batch/v1", "jobs", "ml", "train", "u1") == job("train", "u1")
    assert api.asked == ["train"]
    now[0] = 5.0  # an edit of the workload is seen once the TTL has passed
    api.objects["train"] = job("train", "u1", completions=4)
    assert cache.get("batch/v1", "jobs", "ml", "train", "u1")["spec"]["completions"] == 4
    assert api.asked == ["train", "train"]


def test_another_uid_under_the_same_name_is_read_anew() -> None:
    api = Api()
    api.objects["train"] = job("train", "u1")
    cache = OwnerCache(api.read)
    cache.get("batch/v1", "jobs", "ml", "train", "u1")
    api.objects["train"] = job("train", "u2")  # deleted and created again
    assert cache.get("batch/v1", "jobs", "ml", "train", "u2")["metadata"]["uid"] == "u2"
    assert api.asked == ["train", "train"]


def test_an_owner_that_could_not_be_read_is_asked_for_again() -> None:
    api = Api()
    cache = OwnerCache(api.read)
    assert cache.get("batch/v1", "jobs", "ml", "train", "u1") is None
    api.objects["train"] = job("train", "u1")
    assert cache.get("batch/v1", "jobs", "ml", "train", "u1") is not None
    assert api.asked == ["train", "train"]


def test_an_object_of_another_uid_than_asked_is_returned_but_not_kept() -> None:
    api = Api()
    api.objects["train"] = job("train", "u-new")
    cache = OwnerCache(api.read)
    cache.get("batch/v1", "jobs", "ml", "train", "u-old")
    cache.get("batch/v1", "jobs", "ml", "train", "u-old")
    assert api.asked == ["train", "train"]


def test_concurrent_admissions_of_one_job_share_one_read() -> None:
    api = Api(delay=0.2)
    api.objects["train"] = job("train", "u1")
    cache = OwnerCache(api.read)
    got: list[Any] = []
    threads = [threading.Thread(target=lambda: got.append(
        cache.get("batch/v1", "jobs", "ml", "train", "u1"))) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 16 and all(g == job("train", "u1") for g in got)
    assert api.asked == ["train"]


def test_the_cache_is_bounded() -> None:
    api = Api()
    for i in range(10):
        api.objects[f"j{i}"] = job(f"j{i}", f"u{i}")
    cache = OwnerCache(api.read, max_entries=4)
    for i in range(10):
        cache.get("batch/v1", "jobs", "ml", f"j{i}", f"u{i}")
    cache.get("batch/v1", "jobs", "ml", "j9", "u9")  # kept
    cache.get("batch/v1", "jobs", "ml", "j0", "u0")  # evicted: read again
    assert api.asked[10:] == ["j0"]


def test_a_failed_read_is_shared_not_repeated_one_after_another() -> None:
    """A slow apiserver that answers nothing: the admissions waiting for the
    same owner take the one read's answer, rather than each reading in turn."""
    api = Api(delay=0.3)  # no object: every read fails after 0.3 s
    cache = OwnerCache(api.read)
    got: list[Any] = []
    started = time.monotonic()
    threads = [threading.Thread(target=lambda: got.append(
        cache.get("batch/v1", "jobs", "ml", "train", "u1"))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [None] * 6 and api.asked == ["train"]
    assert time.monotonic() - started < 1.0  # one read's time, not six


def test_kept_objects_leave_their_managed_fields_behind() -> None:
    api = Api()
    api.objects["train"] = {**job("train", "u1"), "metadata": {
        "name": "train", "uid": "u1", "managedFields": [{"manager": "kubectl"}] * 100}}
    cache = OwnerCache(api.read)
    cache.get("batch/v1", "jobs", "ml", "train", "u1")
    kept = cache.peek("batch/v1", "jobs", "ml", "train", "u1")
    assert kept is not None and "managedFields" not in kept["metadata"]
    assert kept["spec"] == {"completions": 3}


def test_expired_entries_go_when_another_is_kept() -> None:
    api, now = Api(), [0.0]
    for name in ("a", "b"):
        api.objects[name] = job(name, f"u-{name}")
    cache = OwnerCache(api.read, ttl=5.0, clock=lambda: now[0])
    cache.get("batch/v1", "jobs", "ml", "a", "u-a")
    now[0] = 6.0
    cache.get("batch/v1", "jobs", "ml", "b", "u-b")
    assert len(cache._entries) == 1
