"""A small, real PyTorch CPU trainer for the end-to-end scenario.

One writer of a synchronous job: an MLP regression on synthetic data, Adam,
saved and loaded through `ckptdrain.torch_helper` (model + optimizer state).
Every line it prints is one JSON event the scenario driver asserts on:

    {"event": "start", "writer": "0", ...}
    {"event": "load", "step": 300, "hash": "…", "tier": "local", "seconds": 0.1, ...}
    {"event": "save", "step": 400, "hash": "…", "reason": "schedule", ...}
    {"event": "save", "step": 437, "hash": "…", "reason": "sigterm", ...}

`hash` is a SHA-256 over every tensor of the model's and the optimizer's state
(names, shapes, dtypes and bytes), computed at save and again after load: equal
hashes prove the restored state is exactly the saved one.

Lockstep: real multi-writer jobs move in step (collectives). Two independent
pods emulate that with a shared step clock: step k is due at TRAIN_EPOCH + k ×
TRAIN_STEP_SECONDS, and a restored trainer runs its missed steps without
pausing until it is back on the clock. Scheduled checkpoints land on steps
that are multiples of TRAIN_CKPT_EVERY, so every writer publishes the same
step numbers and the checkpoint completes globally. A pending request from
the agent is answered by the next of them.

torch comes from the image, or from TRAIN_TORCH_SITE (a read-only directory
holding an installed torch, appended to sys.path after the image's packages).
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

from ckptdrain import torch_helper
from ckptdrain.client import Client


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, "at": round(time.time(), 3), **fields}), flush=True)


def state_hash(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
    digest = hashlib.sha256()

    def feed(prefix: str, value: object) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().contiguous().cpu()
            digest.update(f"{prefix}:{t.dtype}:{tuple(t.shape)}".encode())
            # The tensor's own bytes (no numpy in the image): contiguous CPU memory.
            digest.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                feed(f"{prefix}.{key}", value[key])
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                feed(f"{prefix}[{i}]", item)
        else:
            digest.update(f"{prefix}={value!r}".encode())

    feed("model", model.state_dict())
    feed("optimizer", optimizer.state_dict())
    return digest.hexdigest()


def main() -> int:
    env = os.environ
    width = int(env.get("TRAIN_WIDTH", "1024"))
    depth = int(env.get("TRAIN_DEPTH", "2"))
    step_s = float(env.get("TRAIN_STEP_SECONDS", "0.1"))
    every = int(env.get("TRAIN_CKPT_EVERY", "100"))
    epoch = float(env.get("TRAIN_EPOCH", "0") or time.time())
    torch.set_num_threads(1)

    ckpt = Client()
    torch.manual_seed(1000 + int(ckpt.writer) if ckpt.writer.isdigit() else 1000)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    params = sum(p.numel() for p in model.parameters())
    emit("start", writer=ckpt.writer, writers=ckpt.writers, parameters=params,
         torch=torch.__version__, pid=os.getpid())

    start = 0
    restored = ckpt.restored()
    if restored is not None:
        began = time.monotonic()
        loaded = torch_helper.load(ckpt, model, optimizer)
        result = json.loads(ckpt.restore_result.read_text())
        emit("load", step=loaded, hash=state_hash(model, optimizer), tier=restored.tier,
             bytes=restored.bytes, restore_seconds=restored.seconds,
             load_seconds=round(time.monotonic() - began, 3),
             skipped=result.get("skipped", []), source=result.get("source"))
        start = int(loaded) + 1 if loaded is not None else 0
    else:
        emit("fresh", restore_result=str(ckpt.restore_result))

    step = start
    current = {"step": start - 1}

    def save(step_no: int, reason: str) -> None:
        began = time.monotonic()
        digest = state_hash(model, optimizer)
        path = torch_helper.save(ckpt, step_no, model, optimizer, extra={"hash": digest})
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        emit("save", step=step_no, hash=digest, reason=reason, bytes=size,
             seconds=round(time.monotonic() - began, 3))

    def emergency() -> None:
        done = current["step"]
        emit("sigterm", step=done)
        if done >= 0:
            save(done, "sigterm")

    # Exit non-zero after the emergency checkpoint: the pod was interrupted, not
    # finished, so its Job must run it again (exit 0 would complete the index).
    ckpt.on_preemption(emergency, exit_code=143)
    emit("resume", step=start)
    generator = torch.Generator().manual_seed(7)
    target = torch.nn.Linear(width, 1)
    while True:
        x = torch.randn(32, width, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), target(x).detach())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        current["step"] = step
        ckpt.step_done(step)
        if step % 50 == 0:
            emit("step", step=step, loss=round(loss.item(), 6))
        if step % every == 0:
            request = ckpt.checkpoint_requested()
            save(step, "schedule" if request is None else f"request-{request.seq}")
        step += 1
        delay = epoch + step * step_s - time.time()
        if delay > 0:
            time.sleep(delay)


if __name__ == "__main__":
    raise SystemExit(main())
