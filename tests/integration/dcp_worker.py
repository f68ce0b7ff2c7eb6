"""One rank of a DCP save or load, run as its own process by test_dcp.py.

    python dcp_worker.py '<json job>'

Every rank builds the same reference state (a small model after three Adam
steps, seeded), shards each tensor of at least one dimension over the
ranks (DTensor, Shard(0), on a CPU/gloo mesh), and saves it with
ckptdrain.dcp, or loads it with a StoreReader into zeros sharded over *its*
world and compares its shard to the reference's shard. The last stdout
line is a JSON result.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter

from ckptdrain import dcp as ckpt_dcp
from ckptdrain.client import Client
from ckptdrain.store.s3 import S3Store


def reference() -> dict[str, torch.Tensor]:
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(16, 40), torch.nn.ReLU(), torch.nn.Linear(40, 7))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    data, target = torch.randn(64, 16), torch.randn(64, 7)
    for _ in range(3):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(data), target).backward()
        optimizer.step()
    flat = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for k, v in optimizer.state[p].items():
                flat[f"optim.{names[id(p)]}.{k}"] = v.detach().clone()
    return flat


def sharded(state: dict[str, torch.Tensor], world: int) -> dict[str, Any]:
    if world == 1 or not dist.is_initialized():
        return dict(state)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    return {k: distribute_tensor(v, mesh, [Shard(0)]) if v.dim() else v
            for k, v in state.items()}


def local(value: Any) -> torch.Tensor:
    return value.to_local() if hasattr(value, "to_local") else value


class StallingWriter(FileSystemWriter):  # type: ignore[misc]
    """Writes the data files, says so, then never finishes (the save is killed midway)."""

    started: Path

    def write_data(self, plan: Any, planner: Any) -> Any:
        future = super().write_data(plan, planner)
        future.wait()
        self.started.write_text("written")
        threading.Event().wait()
        return future


def _beside_an_agent(job: dict[str, Any], ref: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A trainer in a pod with the agent: step `step` saved, then an async save of
    the next one that stalls; on SIGTERM it waits a moment for that save, as a
    trainer would before exiting, then exits without it."""
    client = Client()  # the pod's environment: CKPTDRAIN_WORK_DIR
    ckpt_dcp.save(ref, client, job["step"])
    go = Path(job["go"])
    while not go.exists():  # training on, until the test says the agent has the step
        time.sleep(0.05)
    StallingWriter.started = Path(job["started"])
    future = ckpt_dcp.async_save(ref, client, job["step"] + 1, writer_class=StallingWriter)
    client.on_preemption(lambda: future.result(timeout=1.0))
    while not future.done():
        time.sleep(0.05)
    return {"finished": True}


def run(job: dict[str, Any]) -> dict[str, Any]:
    rank, world = job["rank"], job["world"]
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{job['init']}", rank=rank,
                                world_size=world)
    ref = reference()
    if job["mode"] == "save":
        client = Client(job["work_dir"], environ={"CKPTDRAIN_WRITER_ID": str(rank),
                                                  "CKPTDRAIN_WRITERS": str(world)})
        path = ckpt_dcp.save(sharded(ref, world), client, job["step"])
        return {"path": str(path)}
    if job["mode"] == "interrupt":
        client = Client(job["work_dir"], environ={"CKPTDRAIN_WRITERS": "1"})
        ckpt_dcp.save(ref, client, job["step"])
        StallingWriter.started = Path(job["started"])
        future = ckpt_dcp.async_save(ref, client, job["step"] + 1, writer_class=StallingWriter)
        future.result()
        return {"finished": True}
    if job["mode"] == "agent":
        return _beside_an_agent(job, ref)
    cfg = job["store"]
    store = S3Store(cfg["bucket"], cfg["prefix"], endpoint_url=cfg["endpoint"],
                    region=cfg["region"], access_key=cfg["access"], secret_key=cfg["secret"])
    target = sharded({k: torch.zeros_like(v) for k, v in ref.items()}, world)
    step = ckpt_dcp.load(target, store, local=job.get("local"))
    expected = sharded(ref, world)
    mismatched = [k for k in ref if not torch.equal(local(target[k]), local(expected[k]))]
    return {"step": step, "mismatched": mismatched, "keys": len(ref)}


if __name__ == "__main__":
    result = run(json.loads(sys.argv[1]))
    if dist.is_initialized():
        dist.destroy_process_group()
    print(json.dumps(result))
