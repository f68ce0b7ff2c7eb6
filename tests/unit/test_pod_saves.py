"""Several processes of one pod share each save (torchrun's local ranks):
real processes, a real filesystem; the step is published once, when the last
of them completes, holding every process's files."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest
from tests.support import pod_processes

from ckptdrain.client import CONTROL_DIR, Client
from ckptdrain.errors import InvalidInput
from ckptdrain.node.steps import completed_steps, is_writing
from ckptdrain.pod_saves import SAVES_DIR
from ckptdrain.progress import PROGRESS_FILE

SPAWN = multiprocessing.get_context("spawn")


@pytest.mark.parametrize("processes", [2, 4])
def test_every_process_saves_concurrently_and_the_last_publishes_once(
        tmp_path: Path, processes: int) -> None:
    steps, held = [10, 20, 30, 40], 30
    hold, results = SPAWN.Event(), SPAWN.Queue()
    procs = [SPAWN.Process(target=pod_processes.save_steps,
                           args=(tmp_path, r, processes, steps, hold, held, results))
             for r in range(processes)]
    for p in procs:
        p.start()
    seen: list[tuple[int, int, int | None, int]] = []
    try:
        # Every rank but the held one completes step 30: it is still unpublished.
        while sum(1 for _, step, _, _ in seen if step == held) < processes - 1:
            seen.append(results.get(timeout=60))
        assert held not in completed_steps(tmp_path)
        assert is_writing(tmp_path)
        hold.set()
        while len(seen) < processes * len(steps):
            seen.append(results.get(timeout=60))
    finally:
        hold.set()
        for p in procs:
            p.join(60)
    assert [p.exitcode for p in procs] == [0] * processes
    assert completed_steps(tmp_path) == sorted(steps, reverse=True)
    for step in steps:
        files = sorted(f.name for f in (tmp_path / f"step-{step}").iterdir())
        assert files == [f"rank{r}.bin" for r in range(processes)]
        for r in range(processes):
            assert (tmp_path / f"step-{step}" / f"rank{r}.bin").read_bytes() == \
                bytes([r]) * (1000 + step)
        # Exactly one directory was published: whoever saw it saw the same one,
        # and the last to complete always sees it.
        inodes = {ino for _, s, ino, _ in seen if s == step and ino is not None}
        assert inodes == {os.stat(tmp_path / f"step-{step}").st_ino}
    assert not is_writing(tmp_path)
    assert os.listdir(tmp_path / CONTROL_DIR / SAVES_DIR) == []
    # One progress file per pod, written by local rank 0 only.
    rank0_pid = next(pid for r, _, _, pid in seen if r == 0)
    progress = json.loads((tmp_path / CONTROL_DIR / PROGRESS_FILE).read_text())
    assert progress["pid"] == rank0_pid


def _run_dying_save(work: Path, step: int, save: str, dying: int | None) -> list[int | None]:
    procs = [SPAWN.Process(target=pod_processes.die_mid_save,
                           args=(work, r, 3, step, save, -1 if dying is None else dying))
             for r in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    return [p.exitcode for p in procs]


def test_a_process_that_dies_mid_save_publishes_nothing_and_the_next_save_works(
        tmp_path: Path) -> None:
    assert _run_dying_save(tmp_path, 7, "first", dying=1) == [0, 3, 0]
    assert completed_steps(tmp_path) == []
    assert (tmp_path / "step-7.tmp-first").is_dir()
    # The restarted pod saves the same step again, under a new id: rank 0
    # removes the abandoned directory and its marks; the step is published whole.
    assert _run_dying_save(tmp_path, 7, "second", dying=None) == [0, 0, 0]
    assert completed_steps(tmp_path) == [7]
    assert sorted(f.name for f in (tmp_path / "step-7").iterdir()) == \
        ["rank0.bin", "rank1.bin", "rank2.bin"]
    assert (tmp_path / "step-7" / "rank1.bin").read_bytes() == b"whole"
    assert not is_writing(tmp_path)
    assert os.listdir(tmp_path / CONTROL_DIR / SAVES_DIR) == []


def _local(work: Path, rank: int, processes: int = 2) -> Client:
    return pod_processes.client(work, rank, processes)


def test_rank_0_removes_an_abandoned_save_of_the_same_step_only(tmp_path: Path) -> None:
    rank0, rank1 = _local(tmp_path, 0), _local(tmp_path, 1)
    (rank1.begin(5, save="old") / "x").write_text("stale")
    rank1.complete(5, save="old")  # rank 0 never completed: abandoned
    (rank1.begin(6, save="other") / "y").write_text("in flight")
    rank0.begin(5, save="new")
    assert not (tmp_path / "step-5.tmp-old").exists()
    assert not (tmp_path / CONTROL_DIR / SAVES_DIR / "old").exists()
    assert (tmp_path / "step-6.tmp-other" / "y").read_text() == "in flight"
    # Rank 1's earlier mark does not count for the new save.
    rank0.complete(5, save="new")
    assert completed_steps(tmp_path) == []
    rank1.begin(5, save="new")
    rank1.complete(5, save="new")
    assert completed_steps(tmp_path) == [5]


def test_a_second_save_of_a_published_step_is_discarded(tmp_path: Path) -> None:
    pod = [_local(tmp_path, r) for r in range(2)]
    for save, text in (("a", "first"), ("b", "second")):
        for c in pod:
            (c.begin(3, save=save) / f"r{c.local_rank}").write_text(text)
        for c in pod:
            assert c.complete(3, save=save) == tmp_path / "step-3"
    assert (tmp_path / "step-3" / "r1").read_text() == "first"
    assert not is_writing(tmp_path)


def test_only_local_rank_0_acknowledges_a_request(tmp_path: Path) -> None:
    from ckptdrain.client import ACK_FILE, REQUEST_FILE
    from ckptdrain.jsonfile import write_json_atomic
    write_json_atomic(tmp_path / CONTROL_DIR / REQUEST_FILE, {"seq": 4, "reason": "schedule"})
    pod = [_local(tmp_path, r) for r in range(2)]
    for c in pod:
        c.begin(9, save="q")
    pod[1].complete(9, save="q")
    assert not (tmp_path / CONTROL_DIR / ACK_FILE).exists()
    pod[0].complete(9, save="q")
    assert json.loads((tmp_path / CONTROL_DIR / ACK_FILE).read_text())["seq"] == 4
    assert all(c.checkpoint_requested() is None for c in pod)


def test_every_process_reads_what_was_restored(tmp_path: Path) -> None:
    (tmp_path / "step-5").mkdir()
    (tmp_path / "restore.json").write_text(json.dumps({
        "fresh_start": False, "step": 5, "tier": "local", "path": str(tmp_path / "step-5")}))
    pod = [_local(tmp_path, r, 3) for r in range(3)]
    assert [(c.restored().step, c.restored().tier) for c in pod] == [(5, "local")] * 3  # type: ignore[union-attr]
    # A restart in place: every process resumes from the pod's newest published step.
    for c in pod:
        c.begin(8, save="s8")
    for c in pod:
        c.complete(8, save="s8")
    assert [(c.restored().step, c.restored().tier) for c in pod] == [(8, "work")] * 3  # type: ignore[union-attr]


def test_without_a_save_id_one_process_writes_the_whole_step(tmp_path: Path) -> None:
    """A data-parallel trainer that saves from one rank, as it always did:
    no save id, no waiting for the pod's other processes."""
    c = _local(tmp_path, 0)
    (c.begin(1) / "model.pt").write_bytes(b"w")
    assert c.complete(1).is_dir() and os.listdir(tmp_path / "step-1") == ["model.pt"]


def test_marks_count_only_for_their_own_step(tmp_path: Path) -> None:
    """One id (wrongly) used for two steps: rank 1's mark of step 1 never
    completes step 2."""
    rank0, rank1 = _local(tmp_path, 0), _local(tmp_path, 1)
    rank1.begin(1, save="same")
    rank1.complete(1, save="same")
    rank0.begin(2, save="same")
    rank0.complete(2, save="same")
    assert not (tmp_path / "step-2").exists() and not (tmp_path / "step-1").exists()


def test_saves_older_than_the_newest_published_step_are_removed(tmp_path: Path) -> None:
    rank0, rank1 = _local(tmp_path, 0), _local(tmp_path, 1)
    rank0.begin(3, save="dead")  # rank 1 died before it began step 3
    for c in (rank0, rank1):
        c.begin(4, save="s4")
    for c in (rank0, rank1):
        c.complete(4, save="s4")
    (tmp_path / "step-6.tmp-running").mkdir()  # a newer save: never touched
    rank0.begin(5, save="s5")
    names = sorted(os.listdir(tmp_path))
    assert "step-3.tmp-dead" not in names and "step-6.tmp-running" in names
    assert "step-4" in names and "step-5.tmp-s5" in names


@pytest.mark.parametrize("save", ["", "a/b", "..", "x" * 65, "sp ace", 7])
def test_a_bad_save_id_is_refused(tmp_path: Path, save: object) -> None:
    with pytest.raises(InvalidInput, match=r"^save: expected the id this pod's processes"):
        _local(tmp_path, 0).begin(1, save=save)  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []


def test_a_launcher_that_sets_local_rank_alone_means_one_process(tmp_path: Path) -> None:
    c = Client(tmp_path, environ={"LOCAL_RANK": "3"})
    assert (c.local_rank, c.local_processes) == (0, 1)


@pytest.mark.parametrize(("environ", "field", "expected"), [
    ({"CKPTDRAIN_LOCAL_RANK": "x", "CKPTDRAIN_LOCAL_PROCESSES": "2"},
     "CKPTDRAIN_LOCAL_RANK", "a whole number of at least 0"),
    ({"CKPTDRAIN_LOCAL_RANK": "0", "CKPTDRAIN_LOCAL_PROCESSES": "0"},
     "CKPTDRAIN_LOCAL_PROCESSES", "a whole number of at least 1"),
    ({"LOCAL_RANK": "-1", "LOCAL_WORLD_SIZE": "8"}, "LOCAL_RANK", "a whole number"),
    ({"LOCAL_RANK": "8", "LOCAL_WORLD_SIZE": "8"}, "LOCAL_RANK",
     "a local rank below the pod's 8 local process(es) (LOCAL_WORLD_SIZE)"),
    ({"CKPTDRAIN_LOCAL_RANK": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"},
     "CKPTDRAIN_LOCAL_RANK", "a local rank below the pod's 2"),
])
def test_bad_local_layout_names_the_variable(tmp_path: Path, environ: dict[str, str],
                                             field: str, expected: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        Client(tmp_path, environ=environ)
    assert caught.value.field == field and caught.value.expected.startswith(expected)


def test_the_local_layout_comes_from_ckptdrain_then_torchrun_then_one(tmp_path: Path) -> None:
    def layout(environ: dict[str, str]) -> tuple[int, int]:
        c = Client(tmp_path, environ=environ)
        return c.local_rank, c.local_processes
    assert layout({}) == (0, 1)
    assert layout({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"}) == (3, 8)
    assert layout({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8",
                   "CKPTDRAIN_LOCAL_RANK": "1", "CKPTDRAIN_LOCAL_PROCESSES": "2"}) == (1, 2)


def test_one_process_per_pod_keeps_the_plain_temp_directory(tmp_path: Path) -> None:
    c = Client(tmp_path, environ={})
    assert c.begin(2) == tmp_path / "step-2.tmp"
    c.complete(2)
    assert completed_steps(tmp_path) == [2]
    assert not (tmp_path / CONTROL_DIR / SAVES_DIR).exists()

