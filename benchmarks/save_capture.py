"""The trainer's blocking time per save, and the capture after it: a work dir apart
from the local tier (capture copies) against the work dir on the local tier's
filesystem (capture links), with DCP's own savers as the anchor.

    PYTHONPATH=operator:. python -m benchmarks save-capture [--dir /var/tmp]
        [--sizes 256MiB,1GiB] [--files 8] [--rounds 3] [--device cpu|cuda] [--json]

Per size and round, interleaved (a, b, then the anchors, then the next round):
- (a) apart: the trainer's `--files` processes (threads here) each write a
  shard into `<work>/step-<N>.tmp/` and fsync it (DCP's FileSystemWriter does
  by default, sync_files=True), then the directory is renamed to `step-<N>`
  (Client.complete): its blocking time.
  Then LocalTier.capture takes the step into the local tier: a work dir on
  another mount makes link(2) fail with EXDEV, so every file is copied (the
  run refuses reflink and link with EXDEV, as that mount would).
- (b) on the tier: the same save into `<local>/work/`, on the local tier's own
  filesystem, and LocalTier.capture as it is: reflink where the filesystem has
  it, else a hard link.
- anchors, when torch imports: a state dict of the same bytes (`--files`
  float32 tensors, on `--device`) saved by dcp.save with FileSystemWriter, by
  dcp.async_save (a thread; blocking = until it returns), and by async_save
  with DefaultStager(StagingOptions(...)) where this torch has it (pinned
  memory only on a GPU). Without torch the anchors are skipped.
Blocking times and capture times per mode; a/b ratios per round, given as the
median with the lowest and highest round. Both sides write the same disk here,
so (a) and (b) differ by the capture alone; on a node whose work dir is the
boot disk, (a)'s blocking write is also on the slower disk.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ckptdrain import units
from ckptdrain.node import linking
from ckptdrain.node.localtier import LocalTier

CHUNK = 16 << 20


def _exdev(*_: object) -> None:
    raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))


#: What a work dir on another mount gets: neither reflink nor link, so a copy.
ANOTHER_MOUNT = linking.Methods(clone=_exdev, link=_exdev)


def _write_shard(path: Path, shard: memoryview) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o664)
    try:
        for offset in range(0, len(shard), CHUNK):
            view = shard[offset: offset + CHUNK]
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def trainer_save(work: Path, step: int, payload: memoryview, files: int) -> float:
    """The pod's `files` processes each write their shard of `payload` and fsync it,
    together; then the step is published: seconds blocked."""
    started = time.perf_counter()
    tmp = work / f"step-{step}.tmp"
    tmp.mkdir(parents=True)
    each = len(payload) // files
    with ThreadPoolExecutor(max_workers=files) as pool:
        list(pool.map(_write_shard, [tmp / f"__{i}_0.distcp" for i in range(files)],
                      [payload[i * each: (i + 1) * each] for i in range(files)]))
    os.rename(tmp, work / f"step-{step}")
    return time.perf_counter() - started


def one_save(work: Path, tier: LocalTier, step: int, payload: memoryview,
             files: int) -> dict[str, Any]:
    blocking = trainer_save(work, step, payload, files)
    captured = tier.capture(work / f"step-{step}", step, writer=0, writers=1)
    methods = {m: n for m, n in captured.methods.items() if n}
    shutil.rmtree(work / f"step-{step}")  # the work dir's prune, then the tier's
    tier.remove(step)
    subprocess.run(["sync", "-f", str(tier.root)], check=True)
    return {"blocking_s": blocking, "capture_s": captured.seconds, "methods": methods}


class Anchors:
    """DCP's own savers on a state dict of `size` bytes; `available` False without torch."""

    def __init__(self, size: int, files: int, device: str) -> None:
        try:
            import torch
            import torch.distributed.checkpoint as dcp
        except ImportError as err:
            self.available, self.why = False, f"torch does not import ({err})"
            return
        warnings.filterwarnings("ignore")  # DCP warns that no process group is set up
        self.available, self.why = True, ""
        self.torch, self.dcp, self.device = torch, dcp, device
        each = size // files // 4
        self.state = {f"layer{i}": torch.randn(each, device=device) for i in range(files)}
        self.stager: Any = None
        try:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        except ImportError:
            return
        on_gpu = device != "cpu"
        self.staging = {"use_pinned_memory": on_gpu, "use_shared_memory": False,
                        "use_async_staging": True, "use_non_blocking_copy": on_gpu}
        self.stager = DefaultStager(StagingOptions(**self.staging))

    def _sync(self) -> None:
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def run(self, base: Path, r: int) -> dict[str, dict[str, float]]:
        dcp, out = self.dcp, {}
        self._sync()
        started = time.perf_counter()
        dcp.save(self.state, storage_writer=dcp.FileSystemWriter(base / f"dcp-save-{r}"))
        out["dcp.save"] = {"blocking_s": time.perf_counter() - started}
        started = time.perf_counter()
        future = dcp.async_save(self.state,
                                storage_writer=dcp.FileSystemWriter(base / f"dcp-async-{r}"))
        blocked = time.perf_counter() - started
        future.result()
        out["dcp.async_save"] = {"blocking_s": blocked,
                                 "done_s": time.perf_counter() - started}
        if self.stager is not None:
            started = time.perf_counter()
            response = dcp.async_save(
                self.state, storage_writer=dcp.FileSystemWriter(base / f"dcp-staged-{r}"),
                async_stager=self.stager)
            blocked = time.perf_counter() - started
            response.staging_completion.result()
            staged = time.perf_counter() - started
            response.upload_completion.result()
            out["dcp.async_save+stager"] = {"blocking_s": blocked, "staged_s": staged,
                                            "done_s": time.perf_counter() - started}
        for name in ("save", "async", "staged"):
            shutil.rmtree(base / f"dcp-{name}-{r}", ignore_errors=True)
        subprocess.run(["sync", "-f", str(base)], check=True)
        return out


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def bench_size(base: Path, size: int, files: int, rounds: int, device: str) -> dict[str, Any]:
    payload = memoryview(bytearray(os.urandom(1 << 20)) * (size >> 20))
    apart = LocalTier(base / "local-a", methods=ANOTHER_MOUNT)
    on_tier = LocalTier(base / "local-b")
    anchors = Anchors(size, files, device)
    runs: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    anchor_runs: list[dict[str, dict[str, float]]] = []
    for r in range(rounds):
        runs["a"].append(one_save(base / "work-a", apart, r, payload, files))
        runs["b"].append(one_save(on_tier.root / "work", on_tier, r, payload, files))
        if anchors.available:
            anchor_runs.append(anchors.run(base, r))
    result: dict[str, Any] = {"bytes": size, "files": files, "rounds": rounds}
    for mode, found in runs.items():
        result[mode] = {key: _spread([x[key] for x in found])
                        for key in ("blocking_s", "capture_s")}
        result[mode]["methods"] = found[-1]["methods"]
    pairs = list(zip(runs["a"], runs["b"], strict=True))
    result["ratio_a_over_b"] = {
        "blocking": _spread([a["blocking_s"] / b["blocking_s"] for a, b in pairs]),
        "capture": _spread([a["capture_s"] / b["capture_s"] for a, b in pairs]),
        "blocking+capture": _spread([(a["blocking_s"] + a["capture_s"])
                                     / (b["blocking_s"] + b["capture_s"]) for a, b in pairs]),
    }
    if anchors.available:
        result["anchors"] = {name: {key: _spread([run[name][key] for run in anchor_runs])
                                    for key in anchor_runs[0][name]}
                             for name in anchor_runs[0]}
        if anchors.stager is not None:
            result["staging_options"] = anchors.staging
    else:
        result["anchors_skipped"] = anchors.why
    return result


def _line(name: str, spread: dict[str, float], size: int) -> str:
    rate = units.format_rate(size / spread["median"]) if spread["median"] > 0 else "-"
    return (f"  {name:<30} {spread['median']:7.3f} s  [{spread['min']:.3f}-{spread['max']:.3f}]"
            f"  {rate}")


def report(result: dict[str, Any]) -> None:
    size = result["bytes"]
    print(f"{units.format_bytes(size)} in {result['files']} files, {result['rounds']} rounds "
          "(median [lowest-highest]):")
    for mode, label in (("a", "(a) work dir apart, copy"), ("b", "(b) work dir on tier")):
        methods = ", ".join(f"{m} {n}" for m, n in result[mode]["methods"].items())
        print(_line(f"{label}: blocking", result[mode]["blocking_s"], size))
        print(_line(f"    capture ({methods})", result[mode]["capture_s"], size))
    for key, spread in result["ratio_a_over_b"].items():
        print(f"  ratio a/b {key:<20} {spread['median']:7.2f}x [{spread['min']:.2f}-"
              f"{spread['max']:.2f}]")
    for name, figures in result.get("anchors", {}).items():
        for key, spread in figures.items():
            print(_line(f"{name}: {key.removesuffix('_s')}", spread, size))
    if "anchors_skipped" in result:
        print(f"  anchors skipped: {result['anchors_skipped']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    parser.add_argument("--sizes", default="256MiB,1GiB")
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="where the anchors' tensors live")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sizes = [units.parse_bytes("--sizes", s) for s in args.sizes.split(",")]
    results = []
    for size in sizes:
        if size < args.files << 20:
            parser.error(f"--sizes: each size must be at least --files MiB, got {size}")
        with tempfile.TemporaryDirectory(prefix="ckptdrain-bench-", dir=args.dir) as tmp:
            results.append(bench_size(Path(tmp), size, args.files, args.rounds, args.device))
        if not args.json:
            report(results[-1])
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
