"""Ranks agree on one restore step through a real apiserver, with the agent's
documented rights (docs/rbac-agent.md), each rank's restore running as it does in
its init container: its own local tier, a shared file:// global tier."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from documented_rbac import agent_rules
from kubernetes import client, config
from test_rbac import _bind

from ckptdrain import kubeclient
from ckptdrain.node import config as node_config
from ckptdrain.node.localtier import LocalTier
from ckptdrain.restore.engine import restore
from ckptdrain.restore.meeting import Meeting
from ckptdrain.restore.result import RestoreResult
from ckptdrain.store import open_store
from ckptdrain.transfer.drain import Drainer
from ckptdrain.transfer.scan import build_manifest
from support.apiserver import Cluster

WRITERS = 2


def _shard(tmp: Path, step: int, writer: int, flavour: str = "") -> Path:
    src = tmp / "src" / f"{step}-{writer}-{flavour}"
    src.mkdir(parents=True, exist_ok=True)
    (src / "model.bin").write_bytes(f"{flavour}step {step} writer {writer} ".encode() * 500)
    return src


class Job:
    """Two ranks, each with its node's local tier; one global tier."""

    def __init__(self, tmp: Path, namespace: str, api: Any, timeout: str = "4s") -> None:
        self.tmp, self.namespace, self.api, self.timeout = tmp, namespace, api, timeout
        self.store_uri = f"file://{tmp}/store"
        (tmp / "store").mkdir(exist_ok=True)
        self.store = open_store(self.store_uri)
        self.nodes = {w: tmp / f"node-{w}" for w in range(WRITERS)}

    def tier(self, writer: int) -> LocalTier:
        return LocalTier(self.nodes[writer] / "local")

    def save_local(self, step: int, timeline: str, writers: range = range(WRITERS)) -> None:
        for w in writers:
            self.tier(w).capture(_shard(self.tmp, step, w, timeline), step, writer=w,
                                 writers=WRITERS, extra={"timeline": timeline})

    def save_global(self, step: int) -> None:
        for w in range(WRITERS):
            src = _shard(self.tmp, step, w, "g")
            Drainer(self.store, part_size=5 << 20, concurrency=2).drain(
                src, build_manifest(src, step, w, WRITERS, created=float(step)),
                journal_path=self.tmp / f"journal-{step}-{w}.json")

    def cfg(self, writer: int, uid: str) -> node_config.AgentConfig:
        node = self.nodes[writer]
        return node_config.load(environ={
            "CKPTDRAIN_WORK_DIR": str(node / f"work-{uid}"),
            "CKPTDRAIN_LOCAL_DIR": str(node / "local"),
            "CKPTDRAIN_STORE_URI": self.store_uri,
            "CKPTDRAIN_WRITER_ID": str(writer), "CKPTDRAIN_WRITERS": str(WRITERS),
            "CKPTDRAIN_POLICY": f"{self.namespace}/llama", "CKPTDRAIN_POD_NAME": f"llama-{uid}",
            "CKPTDRAIN_POD_UID": uid, "CKPTDRAIN_NAMESPACE": self.namespace,
            "CKPTDRAIN_NODE_NAME": f"node-{writer}",
            "CKPTDRAIN_RESTORE_AGREE_TIMEOUT": self.timeout})

    def restart(self, ranks: range = range(WRITERS)) -> dict[int, tuple[RestoreResult, int]]:
        """A gang restart: a new pod (uid) per rank, restores in parallel."""
        out: dict[int, tuple[RestoreResult, int]] = {}

        def one(writer: int) -> None:
            out[writer] = restore(self.cfg(writer, uuid.uuid4().hex), self.store)

        threads = [threading.Thread(target=one, args=(w,)) for w in ranks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return out


@pytest.fixture
def job(cluster: Cluster, namespace: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Job:
    kubeconfig = _bind(cluster, "Role", "ckptdrain-agent", namespace, agent_rules())
    api = client.CustomObjectsApi(config.new_client_from_config(str(kubeconfig)))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "apiserver")  # restore runs "in a pod"
    monkeypatch.setattr(kubeclient, "custom_objects_api", lambda: api)
    monkeypatch.setattr(kubeclient, "node_custom_objects_api", lambda: api)
    return Job(tmp_path, namespace, api)


def steps(results: dict[int, tuple[RestoreResult, int]]) -> dict[int, int | None]:
    return {w: r.step for w, (r, _) in results.items()}


def test_an_intact_gang_restart_restores_the_newest_local_step_on_every_rank(job: Job) -> None:
    job.save_global(50)
    job.save_local(90, "t1")
    job.save_local(100, "t1")
    results = job.restart()
    assert steps(results) == {0: 100, 1: 100}
    assert {r.tier for r, _ in results.values()} == {"local"}
    for result, code in results.values():
        assert code == 0 and result.agreement is not None
        assert result.agreement["why"] == "agreed" and result.agreement["round"] == 1
        assert result.timeline and result.timeline.startswith("r1-")
    assert sorted(r.agreement["how"] for r, _ in results.values()) == ["adopted", "decided"]
    decision, _ = Meeting(job.namespace, f"{job.namespace}/llama", job.api).decision()
    assert decision is not None and decision.step == 100 and len(decision.members) == 2

    # The next gang restart is a new round, by new pods.
    again = job.restart()
    assert steps(again) == {0: 100, 1: 100}
    assert {r.agreement["round"] for r, _ in again.values()} == {2}


def test_a_pod_on_a_new_node_pulls_every_rank_to_a_step_it_can_get(job: Job) -> None:
    job.save_global(50)
    job.save_local(100, "t1")
    job.nodes[1] = job.tmp / "node-new"  # rank 1's pod lands on an empty node
    results = job.restart()
    assert steps(results) == {0: 50, 1: 50}
    assert {r.tier for r, _ in results.values()} == {"global"}


def test_copies_from_another_timeline_are_not_restored_together(job: Job) -> None:
    job.save_global(50)
    job.save_local(100, "old", writers=range(1))
    job.save_local(100, "new", writers=range(1, 2))
    assert steps(job.restart()) == {0: 50, 1: 50}


def test_a_rank_that_does_not_report_in_time_gets_the_fallback_and_a_late_one_joins_it(
        job: Job) -> None:
    job.save_global(50)
    job.save_local(100, "t1")
    first = job.restart(ranks=range(1))
    result, code = first[0]
    assert code == 0 and result.step == 50 and result.agreement["why"] == "fallback"
    assert "rank 1 did not report" in result.agreement["detail"]
    late = job.restart(ranks=range(1, 2))  # the same gang restart, moments later
    assert steps(late) == {1: 50} and late[1][0].agreement["how"] == "joined"


def test_a_corrupt_local_copy_fails_that_rank_and_the_next_round_passes_it_by(
        job: Job) -> None:
    job.save_global(50)
    job.save_local(90, "t1")
    job.save_local(100, "t1")
    data = job.tier(1).data_dir(100) / "model.bin"
    data.write_bytes(b"X" + data.read_bytes()[1:])
    first = job.restart()
    assert first[0][0].step == 100
    bad, code = first[1]
    assert code == 4 and bad.step is None and "ranks agreed on step 100" in bad.reason
    assert not job.tier(1).has(100)  # worthless, and never agreed on again
    # The job restarts (rank 1's collectives never came up): every rank on 90.
    assert steps(job.restart()) == {0: 90, 1: 90}


class _Running:
    """A rank whose pod keeps running: its agent takes part in rounds (agent/rounds.py)."""

    def __init__(self, job: Job, writer: int, timeline: str) -> None:
        from ckptdrain.agent.loop import Agent
        from ckptdrain.agent.metrics import AgentMetrics
        from ckptdrain.agent.rounds import Rounds

        self.uid = uuid.uuid4().hex
        self.cfg = job.cfg(writer, self.uid)
        self.cfg.work_dir.mkdir(parents=True, exist_ok=True)
        self.agent = Agent(self.cfg, job.tier(writer), _Quiet(), AgentMetrics(), None)
        self.agent.timeline = timeline
        self.rounds = Rounds(self.agent, Meeting(job.namespace, "llama", job.api),
                             store=job.store)
        self.rounds.poll_s = 0.3
        self.stop = threading.Event()

    def __enter__(self) -> _Running:
        self.rounds.start()

        def loop() -> None:  # the agent's own loop applies what a round settled
            while not self.stop.wait(0.1):
                self.rounds.apply()
        threading.Thread(target=loop, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.rounds.stop()

    def save(self, step: int, flavour: str) -> None:
        """The trainer's own save in this pod (complete, maybe not captured yet)."""
        from ckptdrain.client import Client

        client = Client(self.cfg.work_dir)
        (client.begin(step) / "model.bin").write_bytes(
            f"{flavour}step {step} writer {self.cfg.writer} ".encode() * 500)
        client.complete(step)


class _Quiet:
    def report(self, event: object) -> None:
        pass


def test_a_replaced_pod_agrees_at_once_with_the_ranks_that_keep_running(job: Job) -> None:
    job.timeout = "30s"
    job.save_global(50)
    job.save_local(90, "t1")
    job.save_local(100, "t1")
    with _Running(job, 1, "t1") as running:
        running.save(110, "t1")  # rank 1 trained on; rank 0's pod never saved 110
        results = job.restart(ranks=range(1))
    result, code = results[0]
    assert code == 0 and result.step == 100 and result.tier == "local"
    assert result.agreement["why"] == "agreed" and result.agreement["waited"] < 10


def test_trainers_restarted_in_place_resume_from_the_newest_step_every_rank_saved(
        job: Job) -> None:
    from ckptdrain.client import Client

    job.timeout = "30s"
    job.save_global(50)
    job.save_local(100, "t1")
    with _Running(job, 0, "t1") as r0, _Running(job, 1, "t1") as r1:
        # The decision both pods took part in when they started, moments ago:
        # the trainers have saved since, so a restart in place must not join it.
        from ckptdrain.restore.agreement import Decision

        Meeting(job.namespace, "llama", job.api).write_decision(Decision(
            1, 100, "agreed", "", {0: r0.uid, 1: r1.uid}, time.time(), "t1"), None)
        time.sleep(0.05)
        for r in (r0, r1):  # what restore placed when the pods started
            (r.cfg.work_dir / "restore.json").write_text(
                '{"fresh_start": false, "step": 100, "tier": "local", "path": "%s"}'
                % (r.cfg.work_dir / "step-100"))
            r.save(100, "t1")
            r.save(110, "t1")
        r0.save(120, "t1")  # rank 1's trainer died before completing 120
        got: dict[int, object] = {}

        def restart(r: _Running) -> None:
            client = Client(r.cfg.work_dir, environ={
                "CKPTDRAIN_WRITERS": "2", "CKPTDRAIN_WRITER_ID": str(r.cfg.writer)})
            got[r.cfg.writer] = client.restored(timeout=60)

        threads = [threading.Thread(target=restart, args=(r,)) for r in (r0, r1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert {w: getattr(g, "step", None) for w, g in got.items()} == {0: 110, 1: 110}
        assert {getattr(g, "tier", None) for g in got.values()} == {"work"}
        time.sleep(0.5)
        # Rank 0's step 120 belongs to the abandoned timeline: gone from its work dir.
        assert not (r0.cfg.work_dir / "step-120").exists()
        assert r0.agent.timeline != "t1" and r0.agent.timeline == r1.agent.timeline


def test_one_writer_restarted_in_place_resumes_from_its_newest_save(tmp_path: Path) -> None:
    from ckptdrain.client import Client

    work = tmp_path / "work"
    client = Client(work, environ={})
    for step in (10, 20):
        (client.begin(step) / "w.bin").write_bytes(b"x" * step)
        client.complete(step)
    (work / "restore.json").write_text(
        '{"fresh_start": false, "step": 10, "tier": "global", "path": "%s"}'
        % (work / "step-10"))
    again = Client(work, environ={}).restored()
    assert again is not None and (again.step, again.tier, again.bytes) == (20, "work", 20)


def test_a_rank_waiting_at_its_restored_step_is_never_left_on_another(job: Job) -> None:
    job.save_local(90, "t1")
    job.save_local(100, "t1")
    data = job.tier(1).data_dir(100) / "model.bin"
    data.write_bytes(b"X" + data.read_bytes()[1:])  # rank 1 cannot get 100
    job.tier(1).remove(100)
    with _Running(job, 0, "t1") as waiting:
        # Rank 0 resumed from 100 and waits at the rendezvous for rank 1.
        waiting.agent.resumed = 100
        results = job.restart(ranks=range(1, 2))
    result, code = results[1]
    # 90 would put rank 1 on another step than rank 0: nothing is restored.
    assert code == 4 and result.step is None
    assert "running rank(s) sit at step(s) [100]" in result.reason


def test_a_reader_restores_the_step_the_writers_agreed_on(job: Job) -> None:
    from ckptdrain.restore.agreement import Decision

    job.save_global(40)
    job.save_global(50)
    # The writers' decision for this gang restart: 40 (say 50 completed while
    # they agreed, as the old pods' drains finished).
    Meeting(job.namespace, "llama", job.api).write_decision(Decision(
        1, 40, "agreed", "every rank reported", {0: "a", 1: "b"}, time.time(), "r1-x"), None)
    cfg = job.cfg(0, uuid.uuid4().hex)
    object.__setattr__(cfg, "role", "reader")
    result, code = restore(cfg, job.store)
    assert code == 0 and result.step == 40 and result.tier == "global"
    assert result.agreement is not None and result.agreement["how"] == "followed"
