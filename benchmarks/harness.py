"""What the transfer benchmarks share: the dataset, child processes measured
by rusage, and a loopback TCP proxy that timestamps the bytes a client sends."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

MiB = 1 << 20


def make_dataset(root: Path, big: int = 1024 * MiB, shards: int = 16,
                 shard: int = 64 * MiB) -> int:
    """One large file and `shards` shards of random bytes (incompressible). Returns bytes."""
    (root / "shards").mkdir(parents=True, exist_ok=True)
    chunk = os.urandom(16 * MiB)

    def write(path: Path, size: int) -> None:
        with open(path, "wb") as f:
            left = size
            while left:
                n = min(left, len(chunk))
                # A fresh head per chunk keeps chunks distinct (no dedup games).
                f.write(os.urandom(64) + chunk[64:n] if n > 64 else chunk[:n])
                left -= n

    write(root / "model.bin", big)
    for i in range(shards):
        write(root / "shards" / f"rank{i:02d}.pt", shard)
    return big + shards * shard


@dataclass(frozen=True)
class Run:
    seconds: float
    cpu_seconds: float  # user + system of the child
    peak_rss_bytes: int
    returncode: int
    stderr: str


def run_child(argv: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> Run:
    """Run a command; wall time, its own CPU and peak RSS (from wait4's rusage)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    stream, err = proc.stderr, []
    reader = threading.Thread(target=lambda: err.append(stream.read()))
    reader.start()
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    _, status, usage = os.wait4(proc.pid, 0)  # the child's own rusage, not the sum of all
    seconds = time.perf_counter() - started
    killer.cancel()
    reader.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Run(seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024,
               proc.returncode, b"".join(err).decode(errors="replace")[-2000:])


def _machine_cpu() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        values = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (values + [0] * 8)[:8]
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq + steal) / tick, steal / tick


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a running process (/proc/<pid>/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Load:
    """What else ran while a child was measured, in cores (CPU seconds per
    second of wall time): a round where another process took CPU the tools
    wanted is reported as starved, not compared."""
    other_cores: float
    steal_cores: float

    STARVED_OTHER = 0.3
    STARVED_STEAL = 0.1

    @property
    def starved(self) -> bool:
        return self.other_cores > self.STARVED_OTHER or self.steal_cores > self.STARVED_STEAL


_PF_KTHREAD = 0x00200000


def _user_processes_cpu(skip: set[int]) -> dict[int, float]:
    """CPU seconds of every user-space process but `skip`. Kernel threads are
    left out: loopback networking's softirq work lands on ksoftirqd, and it
    is the transfer's own cost, not another process taking the CPU."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[6]) & _PF_KTHREAD:
            continue
        out[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def run_child_under_load_watch(argv: list[str], env: dict[str, str] | None,
                               known_pids: list[int], timeout: float = 600) -> tuple[Run, Load]:
    """run_child, and the CPU other user-space processes used meanwhile (all
    but the child, the `known_pids` (the server it talks to) and ours), as
    far as they ran before and after; and what the hypervisor stole."""
    skip = {os.getpid(), *known_pids}
    _, steal0 = _machine_cpu()
    before = _user_processes_cpu(skip)
    run = run_child(argv, env, timeout)
    _, steal1 = _machine_cpu()
    after = _user_processes_cpu(skip)
    other = sum(max(0.0, cpu - before.get(pid, 0.0)) for pid, cpu in after.items())
    wall = max(run.seconds, 1e-6)
    return run, Load(other / wall, (steal1 - steal0) / wall)


class CountingProxy:
    """127.0.0.1:port -> target; records (time, bytes) the client sends upstream."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.events: list[tuple[float, int]] = []
        self._lock = threading.Lock()
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def reset(self) -> list[tuple[float, int]]:
        with self._lock:
            events, self.events = self.events, []
        return events

    def close(self) -> None:
        self._stop = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        buf = bytearray(256 << 10)
        view = memoryview(buf)
        try:
            while True:
                n = src.recv_into(buf)
                if not n:
                    break
                if count:
                    with self._lock:
                        self.events.append((time.monotonic(), n))
                dst.sendall(view[:n])
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def rate_stats(events: list[tuple[float, int]], target: float, skip: float = 2.0,
               span: float = 30.0, bin_s: float = 0.01) -> dict[str, float]:
    """Mean rate over [first byte + skip, + span] and the worst 1 s window in it."""
    if not events:
        return {"mean": 0.0, "mean_error": -1.0, "worst_1s": 0.0, "worst_1s_excess": -1.0}
    t0 = events[0][0] + skip
    nbins = int(span / bin_s)
    bins = [0] * nbins
    for t, n in events:
        i = int((t - t0) / bin_s)
        if 0 <= i < nbins:
            bins[i] += n
    covered = max(i for i, b in enumerate(bins) if b) + 1 if any(bins) else 1
    mean = sum(bins[:covered]) / (covered * bin_s)
    per = round(1.0 / bin_s)
    windows = [sum(bins[i:i + per]) for i in range(0, max(1, covered - per + 1))]
    worst = max(windows)
    return {"mean": mean, "mean_error": mean / target - 1, "worst_1s": worst,
            "worst_1s_excess": worst / target - 1, "seconds": covered * bin_s}
