"""One rank of the DCP benchmark (benchmarks/dcp.py), run as its own process.

    python -m benchmarks.dcp_rank '<json job>'

`save`: build the benchmark state (seeded float32 matrices, `size` bytes in
all), shard it over the world (DTensor, Shard(0)), save it with
ckptdrain.dcp into this rank's writer directory. `load`: load it resharded
over this world from the store with a StoreReader; after a barrier, time the
load alone (no process start, no torch import). `local`: one rank loads the
step from a local directory holding every writer's files (DCP's own cost,
the floor under any restore). Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ckptdrain import dcp as ckpt_dcp
from ckptdrain.client import Client
from ckptdrain.store.s3 import S3Store

#: Matrices of this many columns; rows divide by 6, so 1, 2, 3 or 6 ranks shard evenly.
COLS = 1024


def state(size: int) -> dict[str, torch.Tensor]:
    """`size` bytes of float32 in eight matrices (model and optimizer alike)."""
    rows = max(6, size // (8 * COLS * 4) // 6 * 6)
    generator = torch.Generator().manual_seed(7)
    return {f"layer{i}": torch.rand(rows, COLS, generator=generator) for i in range(8)}


def sharded(values: dict[str, torch.Tensor], world: int) -> dict[str, Any]:
    if world == 1:
        return values
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    return {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in values.items()}


def main(job: dict[str, Any]) -> dict[str, Any]:
    rank, world = job["rank"], job["world"]
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{job['init']}", rank=rank,
                                world_size=world)
    reference = state(job["size"])
    if job["mode"] == "save":
        client = Client(job["work_dir"], environ={"CKPTDRAIN_WRITER_ID": str(rank),
                                                  "CKPTDRAIN_WRITERS": str(world)})
        ckpt_dcp.save(sharded(reference, world), client, job["step"])
        return {"rank": rank}
    if job["mode"] == "local":  # DCP's own read of the same step from local disk
        target = sharded({k: torch.zeros_like(v) for k, v in reference.items()}, world)
        started = time.perf_counter()
        dcp.load(target, storage_reader=dcp.FileSystemReader(job["dir"]))
        return {"rank": rank, "seconds": time.perf_counter() - started, "fetched": 0,
                "equal": all(torch.equal(target[k], reference[k]) for k in reference)}
    cfg = job["store"]
    store = S3Store(cfg["bucket"], cfg["prefix"], endpoint_url=cfg["endpoint"],
                    region=cfg["region"], access_key=cfg["access"], secret_key=cfg["secret"])
    target = sharded({k: torch.zeros_like(v) for k, v in reference.items()}, world)
    if world > 1:
        dist.barrier()
    started = time.perf_counter()
    with ckpt_dcp.StoreReader(store, job["step"], concurrency=job["concurrency"]) as reader:
        dcp.load(target, storage_reader=reader)
        seconds = time.perf_counter() - started
        fetched = reader.stats.global_bytes
    expected = sharded(reference, world)
    equal = all(torch.equal(getattr(target[k], "to_local", lambda k=k: target[k])(),
                            getattr(expected[k], "to_local", lambda k=k: expected[k])())
                for k in reference)
    return {"rank": rank, "seconds": seconds, "fetched": fetched, "equal": equal}


if __name__ == "__main__":
    result = main(json.loads(sys.argv[1]))
    if dist.is_initialized():
        dist.destroy_process_group()
    print(json.dumps(result))
