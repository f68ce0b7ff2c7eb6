"""Save and load a PyTorch model + optimizer through `ckptdrain.client` (extra `torch`).

    from ckptdrain.client import Client
    from ckptdrain import torch_helper
    ckpt = Client()
    start = torch_helper.load(ckpt, model, optimizer)   # None on a fresh start
    ...
    torch_helper.save(ckpt, step, model, optimizer)

One file per writer (`state.pt`) holding the model's and the optimizer's
state dicts and the step. `save` writes into the client's temp directory and
publishes it with `complete`, so the agent never sees a half-written file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ckptdrain.client import Client

STATE_FILE = "state.pt"


def save(client: Client, step: int, model: torch.nn.Module,
         optimizer: torch.optim.Optimizer | None = None,
         extra: dict[str, Any] | None = None) -> Path:
    """Write step `step` and publish it. Returns the published directory."""
    directory = client.begin(step)
    state: dict[str, Any] = {"step": step, "model": model.state_dict(), "extra": extra or {}}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    torch.save(state, directory / STATE_FILE)
    return client.complete(step)


def load(client: Client, model: torch.nn.Module,
         optimizer: torch.optim.Optimizer | None = None,
         map_location: str | torch.device = "cpu") -> int | None:
    """Load what restore placed into `model` (and `optimizer`); the restored step,
    or None on a fresh start."""
    restored = client.restored()
    if restored is None:
        return None
    # weights_only: a checkpoint is data; never run code from it.
    state = torch.load(restored.path / STATE_FILE, map_location=map_location, weights_only=True)
    model.load_state_dict(state["model"])
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])
