"""What checkpointing costs the store per month: requests, storage and, given prices, money.

Pure. The counts follow what the code sends (tests/integration/
test_request_economics.py checks the drain and restore counts against a
real drain and restore on SeaweedFS and MinIO):

Drain, per writer and global checkpoint, for each of its `files` files of
s bytes with parts of p bytes:
    put   1 per file of one part; ceil(s/p) + 2 (create, complete) otherwise;
          + 1 (the manifest)
    get   1 (is it committed already?) + 1 HEAD per file (its size checked)
    list  2 (unfinished uploads of the attempt; the attempt's objects
          before the commit). MinIO adds 1: it lists uploads by exact key
          only, so the bucket's are listed.
Retention, per writer after each global checkpoint (transfer/prune.py):
    list  6 listings (manifests/ three times, data/, the expired step's
          data, unfinished uploads), each ceil(objects/1000) pages
    get   every writer's manifest of every step kept (complete_steps reads
          them all): writers x (keep + 1). Across the job this grows with
          writers squared.
    delete  files + 1 per writer per expired step (free on S3)
Restore, per writer per restore (fetch of its own shard):
    list  ceil(manifests/1000) pages; get every writer's manifest of the
    step (completeness) + ceil(s/p) ranged GETs per file.

S3 bills PUT, COPY, POST and LIST at one price and GET, HEAD and the rest
at another, per 1,000; DELETE and abort are free. Storage is the `keep`
checkpoints retained, in GiB-months (2^30 bytes for a month).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ckptdrain.errors import InvalidInput

MONTH_SECONDS = 30 * 86400
GIB = 1 << 30
_PAGE = 1000


@dataclass(frozen=True)
class EconomicsInput:
    checkpoint_bytes: float
    global_interval_s: float
    writers: int = 1
    files_per_writer: int = 1
    part_size: int = 64 << 20
    keep: int = 3
    restores_per_month: float = 0.0


@dataclass(frozen=True)
class Prices:
    """Per 1,000 requests of each class, and per GiB-month; any currency."""

    put_per_1000: float | None = None
    get_per_1000: float | None = None
    storage_per_gib_month: float | None = None


@dataclass(frozen=True)
class Economics:
    checkpoints_per_month: float
    #: Requests per global checkpoint, the whole job (drain + retention).
    put_per_checkpoint: float
    get_per_checkpoint: float
    list_per_checkpoint: float
    delete_per_checkpoint: float
    #: Per month, the whole job, restores included.
    put_per_month: float
    get_per_month: float  # GET, HEAD
    list_per_month: float
    delete_per_month: float
    stored_bytes: float
    storage_gib_months: float
    #: Money per month, where the prices were given.
    request_cost: float | None
    storage_cost: float | None
    total_cost: float | None


def _pages(objects: float) -> int:
    return max(1, math.ceil(objects / _PAGE))


def drain_requests(file_sizes: list[int], part_size: int) -> tuple[int, int, int]:
    """(put, get, list) one writer's drain of files of these sizes sends."""
    put = 1 + sum(1 if s <= part_size else math.ceil(s / part_size) + 2 for s in file_sizes)
    return put, 1 + len(file_sizes), 2


def restore_requests(file_sizes: list[int], part_size: int, writers: int,
                     manifests: int) -> tuple[int, int]:
    """(get, list) one writer's restore of its own shard sends."""
    ranged = sum(max(1, math.ceil(s / part_size)) for s in file_sizes)
    return writers + ranged, _pages(manifests)


def parse_price(field: str, value: object) -> float:
    try:
        price = float(str(value).strip())
    except ValueError:
        price = -1.0
    if not math.isfinite(price) or price < 0:
        raise InvalidInput(field, "a price >= 0, e.g. 0.005", value)
    return price


def compute(inp: EconomicsInput, prices: Prices = Prices()) -> Economics:
    if inp.writers < 1 or inp.files_per_writer < 1 or inp.part_size < 1 or inp.keep < 1:
        raise InvalidInput("economics", "writers, files, part size and keep >= 1",
                           (inp.writers, inp.files_per_writer, inp.part_size, inp.keep))
    if not inp.global_interval_s > 0 or inp.checkpoint_bytes < 0 or inp.restores_per_month < 0:
        raise InvalidInput("economics", "a positive interval, sizes and restores >= 0",
                           (inp.global_interval_s, inp.checkpoint_bytes))
    w, f = inp.writers, inp.files_per_writer
    file_size = math.ceil(inp.checkpoint_bytes / (w * f))
    sizes = [file_size] * f
    put, get, lst = drain_requests(sizes, inp.part_size)
    steps = inp.keep + 1
    manifests, data = w * steps, w * f * steps
    r_list = 3 * _pages(manifests) + _pages(data) + _pages(f) + 1
    r_get = w * steps
    delete = f + 1
    per_ckpt = (w * put, w * (get + r_get), w * (lst + r_list), w * delete)
    per_month = MONTH_SECONDS / inp.global_interval_s
    g_restore, l_restore = restore_requests(sizes, inp.part_size, w, manifests)
    restores = inp.restores_per_month
    month = (per_ckpt[0] * per_month, per_ckpt[1] * per_month + w * g_restore * restores,
             per_ckpt[2] * per_month + w * l_restore * restores, per_ckpt[3] * per_month)
    stored = inp.checkpoint_bytes * inp.keep
    gib_months = stored / GIB
    request_cost = None
    if prices.put_per_1000 is not None or prices.get_per_1000 is not None:
        request_cost = ((month[0] + month[2]) / 1000 * (prices.put_per_1000 or 0.0)
                        + month[1] / 1000 * (prices.get_per_1000 or 0.0))
    storage_cost = (None if prices.storage_per_gib_month is None
                    else gib_months * prices.storage_per_gib_month)
    total = (None if request_cost is None and storage_cost is None
             else (request_cost or 0.0) + (storage_cost or 0.0))
    return Economics(
        checkpoints_per_month=per_month, put_per_checkpoint=per_ckpt[0],
        get_per_checkpoint=per_ckpt[1], list_per_checkpoint=per_ckpt[2],
        delete_per_checkpoint=per_ckpt[3], put_per_month=month[0], get_per_month=month[1],
        list_per_month=month[2], delete_per_month=month[3], stored_bytes=stored,
        storage_gib_months=gib_months, request_cost=request_cost, storage_cost=storage_cost,
        total_cost=total)
