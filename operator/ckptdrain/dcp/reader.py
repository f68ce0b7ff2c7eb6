"""A DCP StorageReader over a complete step in the global store (extra `torch`).

    step = load(state_dict, store)             # the newest complete step, verified
or, for DCP's own call:
    with StoreReader(store, step) as reader:   # close() removes its verified copies
        torch.distributed.checkpoint.load(state_dict, storage_reader=reader)

Every rank of the restoring job (any number of them: M readers from the N
writers that saved) builds its own reader. DCP's metadata (`.metadata`,
written by writer 0's rank) says which file and byte range holds each piece;
`read_data` fetches just the byte ranges its rank's plan touches, from any
writer, each part under them verified against the committed manifest's part
CRC32Cs (whole files, for manifests without them; verified.py) before DCP
reads a byte of them, then lets DCP's own FileSystemReader do the rest (slicing,
tensor narrowing, the planner calls), so the on-disk format is DCP's, whatever
torch version wrote it. A corrupt object raises IntegrityError: DCP's load
fails with it and the state dict is never filled with wrong bytes.

`local` maps writer ranks to local-tier roots (`CKPTDRAIN_LOCAL_DIR` of the
pod that was that writer, when this node still has it): their files are
verified in place and linked, not fetched. `sources` replaces the tier order
altogether (sources.py: local -> peer -> global, each a `Source`;
peer_source.tier_sources builds that order from the container's environment).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException

from ckptdrain.dcp.sources import Source
from ckptdrain.dcp.verified import Ranges, Stats, VerifiedFiles
from ckptdrain.errors import IntegrityError, NoCheckpoint
from ckptdrain.restore.reshard import DCP_METADATA, dcp_metadata_holders
from ckptdrain.store.base import Store
from ckptdrain.transfer.catalog import Checkpoint, complete_steps, load_checkpoint

#: DCP's global metadata file, which the coordinator (rank 0) writes.
METADATA = DCP_METADATA


def _checkpoint(store: Store, step: int | None) -> Checkpoint:
    if step is not None:
        return load_checkpoint(store, step)
    complete = complete_steps(store)
    if not complete:
        raise NoCheckpoint(f"no complete checkpoint in {store.uri}")
    return complete[0]


class StoreReader(FileSystemReader):  # type: ignore[misc]
    """DCP's FileSystemReader, fed with verified files of `step` from `store`."""

    def __init__(self, store: Store, step: int | None = None, *,
                 local: Mapping[int, str | Path] | None = None,
                 cache_dir: str | Path | None = None, concurrency: int = 8,
                 sources: Iterable[Source] | None = None) -> None:
        self.checkpoint = _checkpoint(store, step)
        holders = dcp_metadata_holders(self.checkpoint)
        if holders != [0]:
            raise IntegrityError(
                f"step {self.checkpoint.step} is not a DCP checkpoint saved by all its writers "
                f"together: {METADATA} should be writer 0's alone, writers {holders} hold it")
        self._root = Path(tempfile.mkdtemp(prefix=f"ckptdrain-dcp-{self.checkpoint.step}-",
                                           dir=cache_dir))
        super().__init__(self._root)
        try:
            self.files = VerifiedFiles(
                store, self.checkpoint, self._root,
                local=local, concurrency=concurrency, sources=sources)
            # Now, not in read_metadata: DCP turns a failure there into an
            # AssertionError carrying only its text, and IntegrityError must reach
            # the caller as such.
            self.files.ensure({METADATA})
        except BaseException:
            self.close()
            raise

    @property
    def step(self) -> int:
        return self.checkpoint.step

    @property
    def stats(self) -> Stats:
        return self.files.stats

    def reset(self, checkpoint_id: Any = None) -> None:
        # The step was chosen at construction: a checkpoint_id must not move
        # DCP's reads off the verified directory.
        super().reset(None)

    def read_metadata(self) -> Any:
        self.files.ensure({METADATA})
        return super().read_metadata()

    def read_data(self, plan: Any, planner: Any) -> Any:
        needed: dict[str, list[tuple[int, int]]] = {}
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            needed.setdefault(info.relative_path, []).append((info.offset, info.length))
        ranges: dict[str, Ranges] = dict(needed)
        self.files.ensure_ranges(ranges)
        return super().read_data(plan, planner)

    def close(self) -> None:
        """Remove the verified copies (links into the local tier only), and the
        copies its sources fetched (a peer tier's)."""
        shutil.rmtree(self._root, ignore_errors=True)
        files = getattr(self, "files", None)  # None: the constructor failed before
        if files is not None:
            files.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _agreed_step(store: Store, step: int | None, process_group: Any) -> int | None:
    """With several ranks and no step given, rank 0 picks the newest complete step
    for all (a step completing between their scans must not split them)."""
    if step is not None or not (dist.is_available() and dist.is_initialized()):
        return step
    choice: list[object] = [None]
    if dist.get_rank(process_group) == 0:
        try:
            choice[0] = _checkpoint(store, None).step
        except (NoCheckpoint, IntegrityError) as err:
            choice[0] = str(err)
    source = 0 if process_group is None else dist.get_global_rank(process_group, 0)
    dist.broadcast_object_list(choice, src=source, group=process_group)
    if not isinstance(choice[0], int):
        raise NoCheckpoint(str(choice[0]))
    return choice[0]


def _integrity_failure(err: BaseException | None, depth: int = 0) -> BaseException | None:
    """The IntegrityError DCP wrapped (in a CheckpointException's failures, or as
    the cause of what it raised instead), if a rank raised one."""
    if err is None or depth > 8:
        return None
    if isinstance(err, IntegrityError):
        return err
    for failure in getattr(err, "failures", {}).values():
        found = _integrity_failure(failure[0] if isinstance(failure, tuple) else failure,
                                   depth + 1)
        if found is not None:
            return found
    return (_integrity_failure(err.__cause__, depth + 1)
            or _integrity_failure(err.__context__, depth + 1))


def load(state_dict: dict[str, Any], store: Store, step: int | None = None, *,
         process_group: Any = None, planner: Any = None,
         local: Mapping[int, str | Path] | None = None,
         cache_dir: str | Path | None = None,
         sources: Iterable[Source] | None = None) -> int:
    """Load `step` (None: the newest complete one) into `state_dict` in place,
    resharded to this job's layout; the step loaded.

    Collective, like `dcp.load`. A corrupt object raises IntegrityError (DCP
    wraps a rank's failure in CheckpointException; this unwraps it)."""
    chosen = _agreed_step(store, step, process_group)
    reader = StoreReader(store, chosen, local=local, cache_dir=cache_dir, sources=sources)
    try:
        dcp.load(state_dict, storage_reader=reader, planner=planner,
                 process_group=process_group)
    except (CheckpointException, RuntimeError, ValueError) as err:
        integrity = _integrity_failure(err)
        if integrity is not None:
            raise IntegrityError(f"step {reader.step}: {integrity}") from err
        raise
    finally:
        reader.close()
    return reader.step
