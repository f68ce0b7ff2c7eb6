"""One process of a pod of several, run by torchrun (tests/unit/test_dcp_pods.py).

    python -m torch.distributed.run --nnodes=2 --node_rank=W --nproc_per_node=2 \\
        tests/support/dcp_pod_worker.py STEP_SYNC STEP_ASYNC

The pod's writer id and work dir come from the environment (CKPTDRAIN_*), its
local rank and process count from torchrun's. Every rank saves `state(step)`:
one tensor sharded over all ranks (a DTensor, so each rank writes its own
rows) and one tensor of its own; first with ckptdrain.dcp.save, then with
async_save.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from ckptdrain import dcp as ckpt_dcp
from ckptdrain.client import Client

ROWS = 8


def full_state(step: int, world: int) -> dict[str, torch.Tensor]:
    """What every step holds, whole (the test compares a load against it)."""
    state = {"shared": torch.arange(ROWS * 3, dtype=torch.float32).reshape(ROWS, 3) * step}
    for rank in range(world):
        state[f"own.{rank}"] = torch.full((2,), float(rank + step))
    return state


def main(steps: list[int]) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    client = Client()
    for i, step in enumerate(steps):
        whole = full_state(step, world)
        state = {"shared": distribute_tensor(whole["shared"], mesh, [Shard(0)]),
                 f"own.{rank}": whole[f"own.{rank}"]}
        if i % 2 == 0:
            ckpt_dcp.save(state, client, step)
        else:
            ckpt_dcp.async_save(state, client, step).result(timeout=120)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]])
