"""PyTorch Distributed Checkpoint (DCP) over ckptdrain (extra `torch`).

    from ckptdrain.client import Client
    from ckptdrain import dcp as ckpt_dcp
    ckpt = Client()
    ckpt_dcp.save(state_dict, ckpt, step)                 # begin -> dcp.save -> complete
    future = ckpt_dcp.async_save(state_dict, ckpt, step)  # completes when DCP's future does
    step = ckpt_dcp.load(state_dict, store)               # resharded restore from the store

writer.py saves into the client's step directory (each rank into its own
writer's); reader.py serves DCP's read plan from a complete step in the
global store across all its writers, every byte verified before DCP sees
it. torch is imported only when these are used: `import ckptdrain.dcp`
works without it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["StoreReader", "async_save", "load", "save"]


def __getattr__(name: str) -> Any:
    # Lazy: the names pull in torch, which a process without it must not need.
    if name in ("save", "async_save"):
        from ckptdrain.dcp import writer
        return getattr(writer, name)
    if name in ("StoreReader", "load"):
        from ckptdrain.dcp import reader
        return getattr(reader, name)
    raise AttributeError(f"module 'ckptdrain.dcp' has no attribute {name!r}")
