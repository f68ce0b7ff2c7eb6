"""SIGTERM flush with the peer tier replicating vs without it: a real agent,
a real peer server as its partner, a loopback MinIO as the global tier.

    .venv/bin/python -m benchmarks peer-flush [--size 256] [--rounds 5] [--interval 60s]

Each round runs both cases, in an order that alternates, each on fresh
directories: a writer's agent drains a first step of `--size` MiB to the
global tier, then captures a second, local only, which with the peer tier
it starts sending to its partner (the local interval `--interval` sets the
replication rate); half a second into that send, the trainer publishes a
third step and the pod gets SIGTERM at once. Measured from the signal:
until the third step is in the global tier (its `Global` event: captured
and drained by the flush) and until the agent exited.
The goal (docs/peer-tier.md): the flush no slower with replication running,
since replication stops at once for it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support.agentprocs import Pod  # noqa: E402
from tests.support.s3servers import S3Server, free_port, start_minio  # noqa: E402

from ckptdrain.contract.peers import Member, document  # noqa: E402
from ckptdrain.operator.peers import certs as peer_certs  # noqa: E402

MiB = 1 << 20
POLICY = "bench/flush"


def _store_env(server: S3Server) -> dict[str, str]:
    bucket = server.create_bucket()
    return {"CKPTDRAIN_STORE_URI": f"s3://{bucket}/job", "CKPTDRAIN_S3_ENDPOINT":
            server.endpoint_url, "AWS_ACCESS_KEY_ID": server.access_key,
            "AWS_SECRET_ACCESS_KEY": server.secret_key, "AWS_REGION": server.region}


def _publish(pod: Pod, step: int, size: int) -> None:
    tmp = pod.work / f"step-{step}.tmp"
    tmp.mkdir(parents=True)
    block = os.urandom(16 * MiB)
    for i in range(4):
        with open(tmp / f"shard-{i}.bin", "wb") as f:
            left = size // 4
            while left:
                n = min(left, len(block))
                f.write(block[:n])
                left -= n
    os.rename(tmp, pod.work / f"step-{step}")


def one(root: Path, server: S3Server, size: int, interval: str, peer: bool) -> dict[str, Any]:
    """One flush; its seconds from SIGTERM to Global and to the agent's exit."""
    root.mkdir(parents=True)
    env = {**_store_env(server), "CKPTDRAIN_POLICY": POLICY, "CKPTDRAIN_WRITERS": "2",
           "CKPTDRAIN_WRITER_ID": "0", "CKPTDRAIN_GLOBAL_EVERY": "1000000"}
    partner = None
    if peer:
        secret = root / "peer-secret"
        peer_certs.write_material(secret, peer_certs.new_material(POLICY, datetime.now(UTC)))
        ports = [free_port(), free_port()]
        peers = root / "peers" / "peers.json"
        peers.parent.mkdir(parents=True)
        peers.write_text(json.dumps(document(POLICY, [
            Member(r, f"node-{r}", None, f"127.0.0.1:{ports[r]}") for r in (0, 1)])))
        peer_env = {"CKPTDRAIN_PEER_CREDENTIALS": str(secret), "CKPTDRAIN_PEERS_FILE":
                    str(peers), "CKPTDRAIN_PEER_KEEP": "2"}
        (root / "node-1").mkdir()
        partner = Pod(root / "node-1", store_env={
            **env, **peer_env, "CKPTDRAIN_WRITER_ID": "1", "CKPTDRAIN_PEER_PORT":
            str(ports[1])}, interval=interval)
        env |= {**peer_env, "CKPTDRAIN_PEER_PORT": str(ports[0])}
    (root / "node-0").mkdir()
    pod = Pod(root / "node-0", store_env=env, interval=interval, grace="120")
    try:
        if partner is not None:
            server_proc = partner._spawn("peer", ["ckptdrain.peer.command"])
            log = partner.procs[-1][2]
            partner.wait_for(lambda: "peer server started" in log.read_text(errors="replace"),
                             "the partner's peer server")
            assert server_proc.poll() is None
        agent = pod.start_agent()
        _publish(pod, 10, size)  # the first capture goes global
        pod.wait_for(lambda: 10 in pod.states("Global"), "the first step global", 300)
        _publish(pod, 20, size)  # local only: with the tier, replicated
        pod.wait_for(lambda: 20 in pod.states("Local"), "the second step captured")
        area = root / "node-1" / "local" / "peer"
        if partner is not None:
            pod.wait_for(lambda: area.is_dir() and any(
                p.name.startswith(".recv-") for p in area.iterdir()), "replication to start")
        time.sleep(0.5)
        _publish(pod, 30, size)  # saved "just now", and the pod is evicted at once
        sent = time.time()
        code = pod.sigterm(agent)[0]
        exited = time.time()
        at = next((e["at"] for e in pod.event_list()
                   if e["step"] == 30 and e["state"] == "Global"), None)
        stopped = "replication stopped for the SIGTERM flush" in pod.logs()
        return {"peer": peer, "exit_code": code, "global": at is not None,
                "to_global_s": None if at is None else at - sent, "to_exit_s": exited - sent,
                "replication_stopped": stopped if peer else None}
    finally:
        pod.stop_all()
        if partner is not None:
            partner.stop_all()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256, help="MiB in the step")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--interval", default="60s",
                        help="the local interval (sets the replication rate)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ckptdrain-peer-flush-") as tmp, \
            start_minio(Path(tmp)) as server:
        for r in range(args.rounds):
            for peer in ((False, True) if r % 2 == 0 else (True, False)):
                row = one(Path(tmp) / f"r{r}-{int(peer)}", server, args.size * MiB,
                          args.interval, peer)
                row["round"] = r
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary: dict[str, Any] = {"size_mib": args.size, "interval": args.interval,
                               "rounds": rows}
    for peer in (False, True):
        mine = [x for x in rows if x["peer"] is peer]
        key = "with_replication" if peer else "without"
        summary[key] = {
            "to_global_s_median": statistics.median(x["to_global_s"] for x in mine
                                                    if x["to_global_s"] is not None),
            "to_global_s_range": [min(x["to_global_s"] or 0 for x in mine),
                                  max(x["to_global_s"] or 0 for x in mine)],
            "to_exit_s_median": statistics.median(x["to_exit_s"] for x in mine),
            "all_global": all(x["global"] for x in mine),
            "all_exit_0": all(x["exit_code"] == 0 for x in mine)}
    ratios = []
    for r in range(args.rounds):
        pair = {x["peer"]: x for x in rows if x["round"] == r}
        if pair[True]["to_global_s"] and pair[False]["to_global_s"]:
            ratios.append(pair[True]["to_global_s"] / pair[False]["to_global_s"])
    summary["with_over_without_per_round"] = {
        "median": statistics.median(ratios) if ratios else None,
        "range": [min(ratios), max(ratios)] if ratios else None}
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}, indent=2))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
