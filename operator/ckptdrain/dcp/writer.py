"""Save with DCP into the client's work directory, publishing only finished steps.

    path = save(state_dict, client, step)            # blocks until written, then completes
    future = async_save(state_dict, client, step)    # returns after DCP's staging
    ...train on...
    future.result()                                  # the published step directory

Each rank saves with a FileSystemWriter into its own writer's `step-<N>.tmp/`
(the pod's rank is its writer, docs/pod-contract.md): DCP names every rank's
files by rank (`__<rank>_<n>.distcp`) and the coordinator (rank 0) writes
`.metadata` into its own directory once every rank has written. The step is
published with `client.complete` only after DCP reports the save finished:
for `async_save`, in the callback of DCP's future, and only if that future
succeeded. A save that fails leaves `step-<N>.tmp/`, which the agent never
reads; a process killed mid-save leaves the same, so the previous complete
step stays the newest.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

from ckptdrain.client import Client


def _check_rank(client: Client, process_group: Any) -> None:
    """The rank that saves must be the writer whose directory it writes into."""
    if not (dist.is_available() and dist.is_initialized()):
        if client.writers != 1:
            raise ValueError(f"CKPTDRAIN_WRITERS is {client.writers} but no process group is "
                             f"initialized: every writer must save together (one DCP save)")
        return
    rank, world = dist.get_rank(process_group), dist.get_world_size(process_group)
    if world != client.writers:
        raise ValueError(f"CKPTDRAIN_WRITERS is {client.writers} but the process group has "
                         f"{world} ranks: one writer per rank")
    if world > 1 and client.writer != str(rank):
        raise ValueError(f"CKPTDRAIN_WRITER_ID is {client.writer!r} but this process is rank "
                         f"{rank}: a rank must save into its own writer's directory")


def _writer(directory: Path, writer_class: type[FileSystemWriter],
            options: dict[str, Any]) -> FileSystemWriter:
    return writer_class(directory, **options)


def save(state_dict: dict[str, Any], client: Client, step: int, *,
         process_group: Any = None, planner: Any = None,
         writer_class: type[FileSystemWriter] = FileSystemWriter,
         **writer_options: Any) -> Path:
    """Save `state_dict` as step `step` with DCP and publish it; the published directory.

    Collective, like `dcp.save`: every rank calls it. `writer_options` go to
    the FileSystemWriter (thread_count, single_file_per_rank, ...)."""
    _check_rank(client, process_group)
    directory = client.begin(step)
    dcp.save(state_dict, storage_writer=_writer(directory, writer_class, writer_options),
             planner=planner, process_group=process_group)
    return client.complete(step)


def async_save(state_dict: dict[str, Any], client: Client, step: int, *,
               process_group: Any = None, planner: Any = None,
               writer_class: type[FileSystemWriter] = FileSystemWriter,
               **writer_options: Any) -> Future[Path]:
    """Start saving `state_dict` as step `step`; a future of the published directory.

    Returns once DCP has staged the state (training may change the tensors
    from then on). The step is published when DCP's own future completes
    successfully, never before; if the save fails the returned future holds
    DCP's exception and the step stays unpublished. Wait for the previous
    save's future before starting the next one (as with `dcp.async_save`)."""
    _check_rank(client, process_group)
    directory = client.begin(step)
    started = dcp.async_save(state_dict, storage_writer=_writer(directory, writer_class,
                                                                writer_options),
                             planner=planner, process_group=process_group)
    client.progress.unblocked(step)  # the trainer goes on; the upload runs on
    # Newer torch may answer with a response holding staging and upload futures:
    # the step is durable only when the upload is.
    inner = getattr(started, "upload_completion", started)
    outer: Future[Path] = Future()
    outer.set_running_or_notify_cancel()

    def finished(done: Any) -> None:
        try:
            done.result()  # raises what the save raised: then nothing is published
            outer.set_result(client.complete(step))
        except BaseException as err:  # handed to whoever waits on the future
            outer.set_exception(err)

    inner.add_done_callback(finished)
    return outer
