"""A small real PyTorch trainer that checkpoints with DCP, for the e2e DCP step.

Every rank of the job is one pod (its writer id is its rank, CKPTDRAIN_WRITERS
the world size); with more than one, they join a gloo group through a
rendezvous file on a directory every pod mounts (TRAIN_RDV). Under torchrun
(LOCAL_WORLD_SIZE set) a pod runs several ranks, and torchrun's own
rendezvous makes the group: the pod is still one writer. The model (an MLP
with Adam) is trained identically on every rank (same seed, same data: data
parallel without the data split), and checkpointed with
`ckptdrain.dcp.async_save`, every tensor sharded over the ranks (DTensor,
Shard(0)), so each writer holds its own shard. It saves once, at step
TRAIN_SAVE_AT, then keeps training without saving: the step the scenario
restarts from is that one.

On start it loads the newest complete step from the store with
`ckptdrain.dcp.load`, resharded onto this job's world size, whatever the
world size that saved it. Each line it prints is one JSON event:

    {"event": "start", "rank": 0, "world": 2}
    {"event": "fresh"}  or  {"event": "load", "step": 40, "hash": "…", "fetched": …}
    {"event": "save", "step": 40, "hash": "…"}

`hash` is a SHA-256 over the full (unsharded) model and optimizer tensors:
equal hashes from a save with N ranks and a load with M prove the resharded
state is exactly the saved one.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
import time

if os.environ.get("TRAIN_TORCH_SITE"):
    sys.path.append(os.environ["TRAIN_TORCH_SITE"])

import torch
import torch.distributed as dist

from ckptdrain import dcp as ckpt_dcp
from ckptdrain.client import Client
from ckptdrain.errors import NoCheckpoint
from ckptdrain.store import open_store


def emit(event: str, **fields: object) -> None:
    # One write per line: under torchrun a pod's ranks share one stdout.
    line = json.dumps({"event": event, "at": round(time.time(), 3), **fields}) + "\n"
    os.write(sys.stdout.fileno(), line.encode())


def flat_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Model and Adam state as one flat dict of tensors, by parameter name."""
    flat = {f"model.{k}": v for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for k, v in optimizer.state[p].items():
                flat[f"optim.{names[id(p)]}.{k}"] = v
    return flat


def state_hash(flat: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(flat):
        t = flat[name].detach().contiguous().cpu()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        digest.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    return digest.hexdigest()


def sharded(flat: dict[str, torch.Tensor], world: int) -> dict[str, object]:
    if world == 1:
        return dict(flat)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    return {k: distribute_tensor(v.detach(), mesh, [Shard(0)]) if v.dim() else v
            for k, v in flat.items()}


def full(value: object) -> torch.Tensor:
    return value.full_tensor() if hasattr(value, "full_tensor") else value  # type: ignore[return-value]


def main() -> int:
    env = os.environ
    width = int(env.get("TRAIN_WIDTH", "256"))
    step_s = float(env.get("TRAIN_STEP_SECONDS", "0.1"))
    save_at = int(env.get("TRAIN_SAVE_AT", "40"))
    torch.set_num_threads(1)
    ckpt = Client()
    if "LOCAL_WORLD_SIZE" in env:
        # Under torchrun (several processes per pod): its own rendezvous; the
        # pod is one writer of CKPTDRAIN_WRITERS, each process one rank.
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = int(ckpt.writer), ckpt.writers
        if world > 1:
            dist.init_process_group("gloo", init_method=f"file://{env['TRAIN_RDV']}",
                                    rank=rank, world_size=world)
    emit("start", rank=rank, world=world, writer=ckpt.writer, local_rank=ckpt.local_rank,
         uid=os.getuid(), torch=torch.__version__)

    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(),
                                torch.nn.Linear(width, 8))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(7)

    def train_one() -> None:
        x = torch.randn(32, width, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), x[:, :8])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    train_one()  # Adam's state exists from here on: the load template needs its shapes
    start = 1
    store = open_store(env["CKPTDRAIN_STORE_URI"], endpoint_url=env.get("CKPTDRAIN_S3_ENDPOINT"),
                       region=env.get("AWS_REGION"))
    template = sharded({k: torch.zeros_like(v) for k, v in flat_state(model, optimizer).items()},
                       world)
    try:
        loaded = ckpt_dcp.load(template, store)
    except NoCheckpoint:
        emit("fresh")
    else:
        with torch.no_grad():
            for name, value in flat_state(model, optimizer).items():
                value.copy_(full(template[name]))
        emit("load", step=loaded, hash=state_hash(flat_state(model, optimizer)), rank=rank)
        start = loaded + 1

    ckpt.on_preemption(exit_code=143)
    pending = None
    step = start
    while True:
        train_one()
        if step == save_at:
            digest = state_hash(flat_state(model, optimizer))
            pending = ckpt_dcp.async_save(sharded(flat_state(model, optimizer), world), ckpt,
                                          step)
            pending.result()  # the scenario waits for this one step: no overlap to show
            emit("save", step=step, hash=digest, rank=rank)
        step += 1
        time.sleep(step_s)


if __name__ == "__main__":
    raise SystemExit(main())
