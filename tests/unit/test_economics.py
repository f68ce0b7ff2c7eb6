"""Request economics (economics.py, size_costs.py): the model and `ckptdrain size`'s lines."""

from __future__ import annotations

import json

import pytest

from ckptdrain import economics
from ckptdrain.cli import main
from ckptdrain.economics import EconomicsInput, Prices, compute

MiB = 1 << 20


def test_one_writers_drain_counts_what_the_engine_sends() -> None:
    # 12 MiB in 5 MiB parts (3 parts, create, complete) + a small file + the manifest.
    assert economics.drain_requests([12 * MiB, 1000], 5 * MiB) == (7, 3, 2)
    # Restore of that shard with 2 writers: 2 manifests, 3 + 1 ranged GETs, one LIST page.
    assert economics.restore_requests([12 * MiB, 1000], 5 * MiB, 2, 2) == (6, 1)


def test_a_month_of_a_small_job_and_its_cost() -> None:
    e = compute(EconomicsInput(checkpoint_bytes=64 * MiB, global_interval_s=3600, writers=1,
                               part_size=64 * MiB, keep=3),
                Prices(put_per_1000=5.0, get_per_1000=0.4, storage_per_gib_month=23.0))
    assert e.checkpoints_per_month == 720
    # Drain: 1 PUT + manifest; GET committed? + HEAD; LIST 2. Retention: 6 listings, 4 manifests.
    assert (e.put_per_checkpoint, e.get_per_checkpoint, e.list_per_checkpoint) == (2, 6, 8)
    assert e.storage_gib_months == pytest.approx(3 * 64 / 1024)
    assert e.request_cost == pytest.approx((720 * 10) / 1000 * 5.0 + 720 * 6 / 1000 * 0.4)
    assert e.total_cost == pytest.approx(e.request_cost + e.storage_gib_months * 23.0)


def test_retention_reads_grow_with_writers_squared() -> None:
    base = dict(checkpoint_bytes=1e12, global_interval_s=900, keep=3)
    small = compute(EconomicsInput(writers=10, **base))  # type: ignore[arg-type]
    big = compute(EconomicsInput(writers=100, **base))  # type: ignore[arg-type]
    assert big.get_per_checkpoint / small.get_per_checkpoint > 50


def test_no_prices_no_cost_and_bad_prices_are_refused() -> None:
    e = compute(EconomicsInput(checkpoint_bytes=1e9, global_interval_s=900))
    assert e.total_cost is None
    with pytest.raises(economics.InvalidInput, match="--get-price"):
        economics.parse_price("--get-price", "cheap")


def test_size_prints_requests_storage_and_cost(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["size", "--checkpoint-bytes", "1TB", "--interval", "1h", "--drainers", "4",
                 "--put-price", "0.005", "--get-price", "0.0004",
                 "--storage-price", "0.023"]) == 0
    out = capsys.readouterr().out
    assert "requests / month" in out and "storage" in out and "cost / month" in out
    assert main(["size", "--checkpoint-bytes", "1TB", "--interval", "1h", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["store"]["checkpoints_per_month"] == 720 and doc["store"]["total_cost"] is None


def test_small_request_counts_print_as_whole_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    # A handful of LISTs per checkpoint is "8 LIST", not "8.00 LIST"; thousands keep k/M.
    assert main(["size", "--parameters", "405B", "--interval", "15m"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "requests / checkpoint" in x)
    assert " 8 LIST, 6 GET, 2 DELETE" in line and "84.5 k PUT" in line, line


def test_a_bad_cost_flag_names_itself(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["size", "--checkpoint-bytes", "1TB", "--interval", "1h",
                 "--storage-price", "-3"]) == 2
    assert "--storage-price" in capsys.readouterr().err


def test_a_bad_part_size_or_restore_count_names_its_flag_and_says_what_it_wants(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["size", "--checkpoint-bytes", "1TB", "--interval", "1h",
                 "--part-size", "0"]) == 2
    assert "--part-size" in capsys.readouterr().err
    assert main(["size", "--checkpoint-bytes", "1TB", "--interval", "1h",
                 "--restores-per-month", "often"]) == 2
    err = capsys.readouterr().err
    assert "--restores-per-month" in err and "price" not in err
