"""The peer tier: restore one writer's shard from its partner vs from S3 (same
bytes, same machine, loopback), and the sender's CPU for replication.

    .venv/bin/python -m benchmarks peer [--size 512] [--rounds 2] [--out FILE]

One step of `--size` MiB of random bytes (4 files) is captured into a local
tier. Replication: pushed to a real peer server process (`ckptdrain peer`,
mutual TLS 1.3) without a rate limit; the sender's CPU is this process's
user+system time during the push. Restore: the same step fetched back from
the peer (verified, published) and, after `ckptdrain push` to a loopback
MinIO, fetched from the store with the restore's own fetch (parallel ranged
reads, verified). The fastest of `--rounds` runs of each is kept. Both
servers share the machine's cores with the client, as a partner or a
gateway on another node would not: read the ratio, not the absolute rates.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support.s3servers import free_port, start_minio  # noqa: E402

from ckptdrain.contract.peers import Member, document  # noqa: E402
from ckptdrain.node.localtier import LocalTier  # noqa: E402
from ckptdrain.operator import peer_certs  # noqa: E402
from ckptdrain.peer.client import PeerClient  # noqa: E402
from ckptdrain.peer.tls import PeerCredentials  # noqa: E402

MiB = 1 << 20
POLICY = "bench/peer"


def _step(root: Path, size: int) -> LocalTier:
    src = root / "src"
    src.mkdir(parents=True)
    for i in range(4):
        with open(src / f"shard-{i}.bin", "wb") as f:
            left = size // 4
            while left:
                n = min(left, 16 * MiB)
                f.write(os.urandom(n))
                left -= n
    tier = LocalTier(root / "node-a" / "local")
    tier.capture(src, 1, writer=0, writers=1)
    shutil.rmtree(src)
    return tier


def _peer_server(root: Path, secret: Path, port: int) -> subprocess.Popen[bytes]:
    peers = root / "peers.json"
    peers.write_text(json.dumps(document(POLICY, [Member(0, "a", None, f"127.0.0.1:{port}")])))
    env = {**os.environ, "CKPTDRAIN_POLICY": POLICY, "CKPTDRAIN_WRITERS": "1",
           "CKPTDRAIN_LOCAL_DIR": str(root / "node-b" / "local"),
           "CKPTDRAIN_WORK_DIR": str(root / "node-b" / "work"),
           "CKPTDRAIN_PEER_CREDENTIALS": str(secret), "CKPTDRAIN_PEERS_FILE": str(peers),
           "CKPTDRAIN_PEER_PORT": str(port), "CKPTDRAIN_PEER_KEEP": "1"}
    log = open(root / "peer.log", "wb")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen([sys.executable, "-m", "ckptdrain.peer.command"], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while b"peer server started" not in (root / "peer.log").read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit((root / "peer.log").read_text())
        time.sleep(0.1)
    return proc


def _timed(fn: Any) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of fn()."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks peer", description=__doc__)
    parser.add_argument("--size", type=int, default=512, help="step size in MiB")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    size = args.size * MiB
    with tempfile.TemporaryDirectory(prefix="ckptdrain-bench-peer-") as tmp:
        root = Path(tmp)
        tier = _step(root, size)
        secret = root / "secret"
        peer_certs.write_material(secret, peer_certs.new_material(POLICY, datetime.now(UTC)))
        creds = PeerCredentials(secret, POLICY)
        port = free_port()
        server = _peer_server(root, secret, port)
        client = PeerClient(f"127.0.0.1:{port}", creds)
        push, fetch_peer = [], []
        try:
            for r in range(args.rounds):
                held = root / "node-b" / "local" / "peer" / "w0"
                shutil.rmtree(held, ignore_errors=True)
                push.append(_timed(lambda: client.send_step(tier, 1, 0)))
                dest = root / f"restore-peer-{r}"
                fetch_peer.append(_timed(lambda d=dest: client.fetch_step(
                    0, 1, d / ".incoming", d / "step-1", writers=1)))
                shutil.rmtree(dest)
        finally:
            server.terminate()
            server.wait(30)
        fetch_s3 = []
        with start_minio(root / "s3") as minio:
            bucket = minio.create_bucket()
            env = {**os.environ, "AWS_ACCESS_KEY_ID": minio.access_key,
                   "AWS_SECRET_ACCESS_KEY": minio.secret_key, "AWS_REGION": minio.region}
            subprocess.run([str(Path(sys.executable).parent / "ckptdrain"), "push", "-q",
                            "--step", "1", "--endpoint-url", minio.endpoint_url,
                            str(tier.data_dir(1)), f"s3://{bucket}/job"], env=env, check=True)
            os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID",
                                                    "AWS_SECRET_ACCESS_KEY", "AWS_REGION")})
            from ckptdrain.store import open_store
            from ckptdrain.transfer.fetch import fetch

            store = open_store(f"s3://{bucket}/job", endpoint_url=minio.endpoint_url,
                               region=minio.region)
            for r in range(args.rounds):
                dest = root / f"restore-s3-{r}"
                fetch_s3.append(_timed(lambda d=dest: fetch(store, d, step=1, writer=0)))
                shutil.rmtree(dest)
    gb = size / 1e9
    best = {name: min(runs) for name, runs in
            (("push", push), ("fetch_peer", fetch_peer), ("fetch_s3", fetch_s3))}
    result = {
        "bytes": size,
        "replication_MBps": size / best["push"][0] / 1e6,
        "replication_sender_core_s_per_GB": best["push"][1] / gb,
        "restore_peer_s": best["fetch_peer"][0],
        "restore_s3_s": best["fetch_s3"][0],
        "restore_peer_MBps": size / best["fetch_peer"][0] / 1e6,
        "restore_s3_MBps": size / best["fetch_s3"][0] / 1e6,
        "peer_vs_s3_speedup": best["fetch_s3"][0] / best["fetch_peer"][0],
        "rounds": args.rounds,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
