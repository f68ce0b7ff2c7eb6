"""Save with DCP into the client's work directory, publishing only finished steps.

    path = save(state_dict, client, step)            # blocks until written, then completes
    future = async_save(state_dict, client, step)    # returns after DCP's staging
    ...train on...
    future.result()                                  # the published step directory

Each rank saves with a FileSystemWriter into its pod's (its writer's) temp
directory: a pod is one writer with P processes (torchrun's
`--nproc_per_node`, LOCAL_WORLD_SIZE), so the group has writers x P ranks and
global rank r belongs to writer r // P (torchrun numbers a node's ranks
contiguously). DCP names every rank's files by rank (`__<rank>_<n>.distcp`),
so the P processes of a pod write side by side into one
`step-<N>.tmp-<save>/` (`step-<N>.tmp/` with one process), under a save id
rank 0 draws and broadcasts; the coordinator (rank 0) writes `.metadata`
into writer 0's directory once every rank has written. Each process calls
`client.complete` only after DCP reports the save finished (for
`async_save`, in the callback of DCP's future, and only if that future
succeeded); the pod's last one publishes `step-<N>/`. A save that fails, or
a process killed mid-save, leaves the temp directory, which the agent never
reads, so the previous complete step stays the newest.
"""

from __future__ import annotations

import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

from ckptdrain.client import Client


def _check_rank(client: Client, process_group: Any) -> None:
    """The rank that saves must be one of the processes of the writer whose
    directory it writes into (world = writers x processes per pod)."""
    per_pod = client.local_processes
    if not (dist.is_available() and dist.is_initialized()):
        if client.writers != 1 or per_pod != 1:
            raise ValueError(f"CKPTDRAIN_WRITERS is {client.writers} with {per_pod} "
                             f"process(es) per pod but no process group is initialized: "
                             f"every process must save together (one DCP save)")
        return
    rank, world = dist.get_rank(process_group), dist.get_world_size(process_group)
    if world != client.writers * per_pod:
        raise ValueError(f"the process group has {world} ranks but CKPTDRAIN_WRITERS is "
                         f"{client.writers} with {per_pod} process(es) per pod "
                         f"(CKPTDRAIN_LOCAL_PROCESSES or LOCAL_WORLD_SIZE): the group must "
                         f"have writers x processes per pod ranks")
    if world > 1 and client.writer != str(rank // per_pod):
        raise ValueError(f"CKPTDRAIN_WRITER_ID is {client.writer!r} but this process is rank "
                         f"{rank} with {per_pod} process(es) per pod (LOCAL_WORLD_SIZE), "
                         f"so writer {rank // per_pod}: a pod's processes must be contiguous "
                         f"ranks (as torchrun numbers them) saving into their pod's directory")
    if client.local_rank != rank % per_pod:
        raise ValueError(f"the local rank is {client.local_rank} (CKPTDRAIN_LOCAL_RANK or "
                         f"LOCAL_RANK) but rank {rank} of a pod of {per_pod} processes is "
                         f"local rank {rank % per_pod}")


def _save_id(client: Client, step: int, process_group: Any) -> str | None:
    """One id for this save on every process (rank 0's, broadcast); None with
    one process per pod (its plain `step-<N>.tmp/` needs none). Collective."""
    if client.local_processes == 1:
        return None
    chosen: list[object] = [f"{step}-{uuid.uuid4().hex[:16]}"
                            if dist.get_rank(process_group) == 0 else None]
    source = 0 if process_group is None else dist.get_global_rank(process_group, 0)
    dist.broadcast_object_list(chosen, src=source, group=process_group)
    return str(chosen[0])


def _writer(directory: Path, writer_class: type[FileSystemWriter],
            options: dict[str, Any]) -> FileSystemWriter:
    return writer_class(directory, **options)


def save(state_dict: dict[str, Any], client: Client, step: int, *,
         process_group: Any = None, planner: Any = None,
         writer_class: type[FileSystemWriter] = FileSystemWriter,
         **writer_options: Any) -> Path:
    """Save `state_dict` as step `step` with DCP and publish it; the published
    directory (with several processes per pod, it exists once all of them are done).

    Collective, like `dcp.save`: every rank calls it. `writer_options` go to
    the FileSystemWriter (thread_count, single_file_per_rank, ...)."""
    _check_rank(client, process_group)
    save_id = _save_id(client, step, process_group)
    directory = client.begin(step, save=save_id)
    dcp.save(state_dict, storage_writer=_writer(directory, writer_class, writer_options),
             planner=planner, process_group=process_group)
    return client.complete(step, save=save_id)


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
    save_id = _save_id(client, step, process_group)
    directory = client.begin(step, save=save_id)
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
            outer.set_result(client.complete(step, save=save_id))
        except BaseException as err:  # handed to whoever waits on the future
            outer.set_exception(err)
            if isinstance(err, SystemExit | KeyboardInterrupt):
                # Run at once in the main thread (the save was already done):
                # a preemption's exit, deferred to the end of complete(), must
                # still end the trainer, not wait in the future.
                raise

    inner.add_done_callback(finished)
    return outer
