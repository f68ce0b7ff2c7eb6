"""`ckptdrain size`'s request and storage lines: its flags, rows and JSON.

Pure formatting over economics.py, kept out of cli.py so the sizing model
and the cost model stay two rooms. Writers are the sizing's drainers (each
node that drains writes its own shard).
"""

from __future__ import annotations

import argparse
from typing import Any

from ckptdrain import economics, sizing, units
from ckptdrain.errors import InvalidInput

#: (flag, help); parsed in `economics_input` / `prices`.
FLAGS = [
    ("--files-per-writer", "files in each writer's shard (default 1)"),
    ("--part-size", "multipart part size of the drain (default 64MiB)"),
    ("--keep", "complete global checkpoints kept (default 3, as the policy)"),
    ("--restores-per-month", "whole-job restores a month (default: 30 days / --mtti, else 0)"),
    ("--put-price", "price per 1,000 PUT/COPY/POST/LIST requests, e.g. 0.005"),
    ("--get-price", "price per 1,000 GET/HEAD requests, e.g. 0.0004"),
    ("--storage-price", "price per GiB-month stored, e.g. 0.023"),
]


def add_flags(parser: argparse.ArgumentParser) -> None:
    for flag, text in FLAGS:
        parser.add_argument(flag, help=text)


def economics_input(args: argparse.Namespace, s: sizing.Sizing,
                    mtti_s: float | None) -> economics.EconomicsInput:
    files = args.files_per_writer
    restores = args.restores_per_month
    return economics.EconomicsInput(
        checkpoint_bytes=s.checkpoint_bytes, global_interval_s=s.global_interval_s,
        writers=s.drainers,
        files_per_writer=1 if files is None else units.parse_positive_int(
            "--files-per-writer", files),
        part_size=64 << 20 if args.part_size is None else _part_size(args.part_size),
        keep=3 if args.keep is None else units.parse_positive_int("--keep", args.keep),
        restores_per_month=(economics.MONTH_SECONDS / mtti_s if restores is None and mtti_s
                            else 0.0 if restores is None
                            else _restores("--restores-per-month", restores)))


def _part_size(value: str) -> int:
    size = units.parse_bytes("--part-size", value)
    if size < 1:  # else the model refuses it naming no flag
        raise InvalidInput("--part-size", "a part size above zero, e.g. 64MiB", value)
    return size


def _restores(flag: str, value: str) -> float:
    try:
        return economics.parse_price(flag, value)
    except InvalidInput:
        raise InvalidInput(flag, "a number of restores >= 0, e.g. 2", value) from None


def prices(args: argparse.Namespace) -> economics.Prices:
    def one(flag: str, value: str | None) -> float | None:
        return None if value is None else economics.parse_price(flag, value)

    return economics.Prices(one("--put-price", args.put_price), one("--get-price", args.get_price),
                            one("--storage-price", args.storage_price))


def _requests(value: float) -> str:
    """A request count: "8" rather than "8.00" below a thousand, "84.5 k" above."""
    return f"{value:.3g}" if value < 1000 else units.format_count(value)


def rows(e: economics.Economics) -> list[tuple[str, str]]:
    count = _requests
    out = [
        ("requests / checkpoint", f"{count(e.put_per_checkpoint)} PUT, "
         f"{count(e.list_per_checkpoint)} LIST, {count(e.get_per_checkpoint)} GET, "
         f"{count(e.delete_per_checkpoint)} DELETE"),
        ("requests / month", f"{count(e.put_per_month + e.list_per_month)} PUT/LIST, "
         f"{count(e.get_per_month)} GET ({count(e.checkpoints_per_month)} checkpoints)"),
        ("storage", f"{units.format_bytes(e.stored_bytes)} "
         f"({e.storage_gib_months:,.0f} GiB-months / month)"),
    ]
    if e.total_cost is not None:
        parts = []
        if e.request_cost is not None:
            parts.append(f"requests {e.request_cost:,.2f}")
        if e.storage_cost is not None:
            parts.append(f"storage {e.storage_cost:,.2f}")
        out.append(("cost / month", f"{e.total_cost:,.2f}  ({', '.join(parts)})"))
    return out


def to_json(e: economics.Economics) -> dict[str, Any]:
    from dataclasses import asdict

    return {"store": asdict(e)}


def compute(args: argparse.Namespace, s: sizing.Sizing,
            mtti_s: float | None) -> economics.Economics:
    return economics.compute(economics_input(args, s, mtti_s), prices(args))
