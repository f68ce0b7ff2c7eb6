"""The peer tier: restore one writer's shard from its partner vs from S3 (same
bytes, same machine, loopback), and the sender's CPU for replication.

    .venv/bin/python -m benchmarks peer [--size 512] [--rounds 3] [--out FILE]
                                        [--restore-dir /dev/shm]

One step of `--size` MiB of random bytes (4 files) is captured into a local
tier, pushed once to a real peer server process (`ckptdrain peer`, mutual
TLS 1.3) and once to a loopback MinIO (`ckptdrain push`). Then, in each of
`--rounds` interleaved rounds, with the page cache's dirty data written back
(`sync`) before each measured step:

- replication: the step pushed again to the partner (its copy removed first)
  without a rate limit; the sender's CPU is this process's user+system time;
- the TLS floor: the same number of bytes sent from memory over one TLS 1.3
  connection to a process that discards them: what encrypting and sending
  costs here before any file is read (the sender's CPU has no lower bound
  below it);
- restore from the partner (verified, published) and from the store with
  restore's own fetch (parallel ranged reads, verified), from MinIO over
  plain http and from a second MinIO over https (as every cloud's object
  store is reached), in an order that rotates every round.

Reported: the median of each figure over the rounds with its range, and the
partner-vs-store ratios per round (median and range). Every server shares the
machine's cores with the client, as a partner or a gateway on another node
would not: over loopback, TLS is most of what the partner costs and plain
http costs the store nothing, so read the https ratio as the one that
compares like with like.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import socket
import statistics
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
from ckptdrain.operator.peers import certs as peer_certs  # noqa: E402
from ckptdrain.operator.tls import certs  # noqa: E402
from ckptdrain.peer.client import PeerClient  # noqa: E402
from ckptdrain.peer.stream import CHUNK  # noqa: E402
from ckptdrain.peer.tls import PeerCredentials  # noqa: E402
from ckptdrain.transfer.fetch import fetch  # noqa: E402

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
    """(wall seconds, this process's CPU seconds) of fn(), after a sync so
    that dirty pages of the step before are not written back during it."""
    os.sync()
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def _sink(secret: Path, ready: Any) -> None:
    """Accept TLS connections and discard what they send (the floor's far end)."""
    ctx = PeerCredentials(secret, POLICY).server_context()
    listener = socket.create_server(("127.0.0.1", 0))
    ready.put(listener.getsockname()[1])
    buffer = bytearray(1 << 20)
    while True:
        conn, _ = listener.accept()
        with ctx.wrap_socket(conn, server_side=True) as tls:
            while tls.recv_into(buffer):
                pass


def _tls_floor(creds: PeerCredentials, port: int, size: int) -> None:
    """`size` bytes from memory over one TLS connection, in the peer's chunks."""
    chunk = memoryview(os.urandom(CHUNK))
    with socket.create_connection(("127.0.0.1", port)) as raw, \
            creds.client_context().wrap_socket(raw) as tls:
        left = size
        while left:
            n = min(left, CHUNK)
            tls.sendall(chunk[:n])
            left -= n


def _server_tls(root: Path) -> tuple[Path, Path, Path]:
    """(certificate, key, CA) for a MinIO serving https on localhost."""
    root.mkdir(parents=True)
    now = datetime.now(UTC)
    ca, ca_key = certs.new_ca("ckptdrain benchmark CA", now)
    cert, key = certs.new_serving(ca, ca_key, ["localhost"], now)
    (root / "ca.pem").write_bytes(certs._pem(ca))
    (root / "cert.pem").write_bytes(certs._pem(cert))
    (root / "key.pem").write_bytes(key)
    return root / "cert.pem", root / "key.pem", root / "ca.pem"


def _pushed(tier: LocalTier, server: Any) -> Any:
    """The step pushed to `server` with `ckptdrain push`; the store to fetch it from."""
    from ckptdrain.store import open_store
    from ckptdrain.store.s3_options import S3Options

    bucket = server.create_bucket()
    keys = {"AWS_ACCESS_KEY_ID": server.access_key,
            "AWS_SECRET_ACCESS_KEY": server.secret_key, "AWS_REGION": server.region}
    env = {**os.environ, **keys}
    if server.ca_bundle:
        env["CKPTDRAIN_S3_CA_BUNDLE"] = str(server.ca_bundle)
    subprocess.run([str(Path(sys.executable).parent / "ckptdrain"), "push", "-q",
                    "--step", "1", "--endpoint-url", server.endpoint_url,
                    str(tier.data_dir(1)), f"s3://{bucket}/job"], env=env, check=True)
    os.environ.update(keys)
    options = S3Options(ca_bundle=str(server.ca_bundle)) if server.ca_bundle else None
    return open_store(f"s3://{bucket}/job", endpoint_url=server.endpoint_url,
                      region=server.region, options=options)


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks peer", description=__doc__)
    parser.add_argument("--size", type=int, default=512, help="step size in MiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--restore-dir", type=Path,
                        help="where restores land (default: beside the step; a tmpfs such "
                             "as /dev/shm takes the disk's writeback out of the comparison)")
    args = parser.parse_args(argv)
    size = args.size * MiB
    rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="ckptdrain-bench-peer-") as tmp, \
            start_minio(Path(tmp) / "s3") as minio, \
            start_minio(Path(tmp) / "s3-tls", tls=_server_tls(Path(tmp) / "tls")) as tls_minio:
        root = Path(tmp)
        tier = _step(root, size)
        secret = root / "secret"
        peer_certs.write_material(secret, peer_certs.new_material(POLICY, datetime.now(UTC)))
        creds = PeerCredentials(secret, POLICY)
        port = free_port()
        server = _peer_server(root, secret, port)
        ready: Any = multiprocessing.get_context("fork").Queue()
        sink = multiprocessing.get_context("fork").Process(target=_sink, args=(secret, ready),
                                                           daemon=True)
        sink.start()
        sink_port = ready.get(timeout=30)
        client = PeerClient(f"127.0.0.1:{port}", creds)
        store = _pushed(tier, minio)
        tls_store = _pushed(tier, tls_minio)
        held = root / "node-b" / "local" / "peer" / "w0"
        try:
            for r in range(args.rounds):
                shutil.rmtree(held, ignore_errors=True)
                push = _timed(lambda: client.send_step(tier, 1, 0))
                floor = _timed(lambda: _tls_floor(creds, sink_port, size))
                fetches = {
                    "peer": lambda d: client.fetch_step(0, 1, d / ".incoming", d / "step-1",
                                                        writers=1),
                    "s3": lambda d: fetch(store, d, step=1, writer=0),
                    "s3_tls": lambda d: fetch(tls_store, d, step=1, writer=0)}
                names = list(fetches)
                order = names[r % 3:] + names[:r % 3]
                took = {}
                for name in order:
                    dest = (args.restore_dir or root) / f"ckptdrain-bench-{name}-{r}"
                    took[name] = _timed(lambda f=fetches[name], d=dest: f(d))
                    shutil.rmtree(dest)
                rounds.append({
                    "replication_MBps": size / push[0] / 1e6,
                    "replication_sender_core_s_per_GB": push[1] / (size / 1e9),
                    "tls_floor_core_s_per_GB": floor[1] / (size / 1e9),
                    "restore_peer_s": took["peer"][0], "restore_s3_s": took["s3"][0],
                    "restore_s3_tls_s": took["s3_tls"][0],
                    "peer_vs_s3_speedup": took["s3"][0] / took["peer"][0],
                    "peer_vs_s3_tls_speedup": took["s3_tls"][0] / took["peer"][0],
                    "order": " ".join(order)})
                print(json.dumps(rounds[-1]), flush=True)
        finally:
            server.terminate()
            server.wait(30)
            sink.terminate()
    figures = [k for k in rounds[0] if k != "order"]
    result = {"bytes": size, "restore_dir": str(args.restore_dir or "beside the step"),
              "rounds": rounds,
              **{k: _summary([r[k] for r in rounds]) for k in figures}}
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
