"""The peer tier with real agent processes on loopback and a real S3 server.

Two "nodes" (two pods, each with its own local tier) run writer 0 and 1 of
one policy: on each, a peer server (the sidecar that runs before restore)
and an agent, which replicates its newest local step to the other node over
mutual TLS. Losing node 0 (its processes killed, its local tier and work dir
wiped) and restarting the job still restores both writers at the newest
*local* step, writer 0 from its partner; a corrupt partner copy falls back
to the older global step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from tests.support.agentprocs import WAIT_CAP, Pod
from tests.support.s3servers import S3Server, free_port

from ckptdrain.contract.peers import Member, document
from ckptdrain.node.localtier import LocalTier
from ckptdrain.operator.peers import certs as peer_certs

POLICY = "ns/train"


class Cluster:
    """Two pods of one policy, paired with each other, sharing one bucket."""

    def __init__(self, root: Path, store_env: dict[str, str], interval: str = "0.5s") -> None:
        secret = root / "peer-secret"
        peer_certs.write_material(secret, peer_certs.new_material(POLICY, datetime.now(UTC)))
        ports = [free_port(), free_port()]
        peers_file = root / "peers" / "peers.json"
        peers_file.parent.mkdir(parents=True)
        members = [Member(r, f"node-{r}", None, f"127.0.0.1:{ports[r]}") for r in (0, 1)]
        peers_file.write_text(json.dumps(document(POLICY, members)))
        self.pods = []
        for rank in (0, 1):
            env = {**store_env, "CKPTDRAIN_POLICY": POLICY, "CKPTDRAIN_WRITERS": "2",
                   "CKPTDRAIN_WRITER_ID": str(rank), "CKPTDRAIN_GLOBAL_EVERY": "1000000",
                   "CKPTDRAIN_PEER_CREDENTIALS": str(secret),
                   "CKPTDRAIN_PEERS_FILE": str(peers_file),
                   "CKPTDRAIN_PEER_PORT": str(ports[rank]), "CKPTDRAIN_PEER_KEEP": "2"}
            (root / f"node-{rank}").mkdir()
            self.pods.append(Pod(root / f"node-{rank}", store_env=env, interval=interval))

    def start_peer_server(self, rank: int) -> subprocess.Popen[bytes]:
        pod = self.pods[rank]
        proc = pod._spawn("peer", ["ckptdrain.peer.command"])
        log = pod.procs[-1][2]
        deadline = time.monotonic() + WAIT_CAP
        while "peer server started" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, pod.logs()
            time.sleep(0.1)
        return proc

    def publish(self, step: int, model_mib: int = 2) -> None:
        """Each writer's trainer publishes `step` (temp dir, then rename)."""
        for rank, pod in enumerate(self.pods):
            tmp = pod.work / f"step-{step}.tmp"
            (tmp / "optim").mkdir(parents=True)
            (tmp / "model.bin").write_bytes(os.urandom(model_mib << 20))
            (tmp / "optim" / f"rank-{rank}.bin").write_bytes(os.urandom(1 << 20))
            os.rename(tmp, pod.work / f"step-{step}")

    def held(self, holder: int, writer: int) -> list[int]:
        return LocalTier(self.pods[holder].local / "peer" / f"w{writer}").steps()

    def stop(self) -> None:
        for pod in self.pods:
            pod.stop_all()


def _store_env(server: S3Server, request: pytest.FixtureRequest) -> dict[str, str]:
    bucket = server.create_bucket()
    request.addfinalizer(lambda: server.delete_bucket(bucket))
    return {"CKPTDRAIN_STORE_URI": f"s3://{bucket}/job", "CKPTDRAIN_S3_ENDPOINT":
            server.endpoint_url, "AWS_ACCESS_KEY_ID": server.access_key,
            "AWS_SECRET_ACCESS_KEY": server.secret_key, "AWS_REGION": server.region}


@pytest.fixture
def cluster(s3server: S3Server, request: pytest.FixtureRequest,
            tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path, _store_env(s3server, request))
    yield c
    c.stop()


def _replicated(c: Cluster) -> dict[int, bytes]:
    """Step 10 goes global (the first capture), step 20 only local and to the
    partners. Returns writer 0's files of step 20 as the trainer wrote them."""
    pod0, pod1 = c.pods
    servers = [c.start_peer_server(rank) for rank in (0, 1)]
    agents = [pod.start_agent() for pod in c.pods]
    c.publish(10)
    for pod in c.pods:
        pod.wait_for(lambda p=pod: 10 in p.states("Global"), "step 10 to go global")
    c.publish(20)
    for pod in c.pods:
        pod.wait_for(lambda p=pod: 20 in p.tier.steps(), "step 20 to be captured")
    pod0.wait_for(lambda: c.held(1, 0)[:1] == [20] and c.held(0, 1)[:1] == [20],
                  "step 20 to reach both partners")
    assert not pod0.tier.is_global(20)
    for pod in c.pods:  # the agent says so once the partner holds the copy
        pod.wait_for(lambda p=pod: any(
            e["step"] == 20 and e["message"] == "copy held by the partner"
            for e in p.event_list()), "the peer copy to be reported")
    original = {0: (pod0.tier.data_dir(20) / "model.bin").read_bytes(),
                1: (pod0.tier.data_dir(20) / "optim" / "rank-0.bin").read_bytes()}
    # Node 0 is lost: its processes die with it, its local tier and work dir are gone.
    for proc in (agents[0], servers[0]):
        proc.kill()
        proc.wait(30)
    shutil.rmtree(pod0.local)
    shutil.rmtree(pod0.work)
    # The job restarts: writer 0's new pod (on a fresh node) and writer 1's new pod
    # start their peer servers, then restore; no agent runs yet.
    assert pod1.sigterm(agents[1]) == [0]
    shutil.rmtree(pod1.work)
    c.start_peer_server(0)
    return original


def test_a_lost_node_restores_from_its_partner_at_the_newest_local_step(
        cluster: Cluster) -> None:
    pod0, pod1 = cluster.pods
    original = _replicated(cluster)
    code, result = pod0.restore()
    assert code == 0, result
    assert (result["step"], result["tier"]) == (20, "peer"), result
    restored = Path(result["path"])
    assert (restored / "model.bin").read_bytes() == original[0]
    assert (restored / "optim" / "rank-0.bin").read_bytes() == original[1]
    # The surviving writer restores the same step from its own local tier.
    code, other = pod1.restore()
    assert (code, other["step"], other["tier"]) == (0, 20, "local"), other


def test_a_corrupt_partner_copy_falls_back_to_the_global_tier(cluster: Cluster) -> None:
    pod0, _ = cluster.pods
    _replicated(cluster)
    held = cluster.pods[1].local / "peer" / "w0" / "step-20" / "data" / "model.bin"
    data = bytearray(held.read_bytes())
    data[len(data) // 3] ^= 0x10
    held.write_bytes(bytes(data))
    code, result = pod0.restore()
    assert code == 0, result
    assert (result["step"], result["tier"]) == (10, "global"), result
    peer_skips = [s for s in result["skipped"] if (s["step"], s["tier"]) == (20, "peer")]
    assert peer_skips and "crc32c" in peer_skips[0]["reason"].lower(), result["skipped"]


def test_a_peer_tier_with_nothing_newer_says_what_it_held(cluster: Cluster) -> None:
    """The partner lost writer 0's copies too: the global step is restored,
    and the result says what each writer's servers had."""
    pod0, _ = cluster.pods
    _replicated(cluster)
    shutil.rmtree(cluster.pods[1].local / "peer" / "w0")
    code, result = pod0.restore()
    assert code == 0, result
    assert (result["step"], result["tier"]) == (10, "global"), result
    said = [s["reason"] for s in result["skipped"] if s["tier"] == "peer"]
    assert any("every writer can get" in r and "writer 0: none" in r
               and "writer 1: 20" in r for r in said), result["skipped"]


def test_sigterm_stops_replication_and_the_partner_publishes_no_half_copy(
        s3server: S3Server, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    # A 10-minute local interval makes the replication rate the 1 MB/s floor:
    # a 24 MiB step takes ~25 s to send, and SIGTERM comes in the middle.
    c = Cluster(tmp_path, _store_env(s3server, request), interval="600s")
    request.addfinalizer(c.stop)
    pod0 = c.pods[0]
    c.start_peer_server(1)
    agent = pod0.start_agent()
    c.publish(10, model_mib=24)
    area = c.pods[1].local / "peer"
    pod0.wait_for(lambda: area.is_dir() and any(
        p.name.startswith(".recv-") for p in area.iterdir()), "replication to start")
    assert pod0.sigterm(agent) == [0]
    assert pod0.tier.is_global(10), pod0.logs()  # the flush did its work
    assert "replication stopped for the SIGTERM flush" in pod0.logs()
    pod0.wait_for(lambda: not any(p.name.startswith(".recv-") for p in area.iterdir()),
                  "the receiver to drop the half-sent copy")
    assert c.held(1, 0) == []
