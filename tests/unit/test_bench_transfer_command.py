"""benchmarks/transfer: the command a report records repeats the run."""

from __future__ import annotations

import shlex
import sys
import types
from typing import Any

import benchmarks.__main__ as entry
import pytest
from benchmarks import transfer


def test_the_recorded_command_is_the_benchmarks_own_arguments(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # As `python -m benchmarks transfer --rounds 3 ...` leaves sys.argv: the
    # benchmark's name is still in it, and must not be recorded twice.
    argv = ["--rounds", "3", "--skip-rate", "--tools", "awscrt"]
    monkeypatch.setattr(sys, "argv", ["benchmarks/__main__.py", "transfer", *argv])
    args = transfer.parse(argv)
    assert args.command == "python -m benchmarks transfer --rounds 3 --skip-rate --tools awscrt"


def test_the_recorded_command_splits_back_into_the_argv() -> None:
    argv = ["--fixed-only", "--out", "/tmp/a dir/fixed.json", "--tools", "boto3,awscrt"]
    words = shlex.split(transfer.parse(argv).command)
    assert words[:4] == ["python", "-m", "benchmarks", "transfer"] and words[4:] == argv


def test_the_entry_point_hands_on_the_arguments_without_the_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    fake = types.SimpleNamespace(main=lambda argv: seen.append(argv) or 0)

    def load(name: str) -> Any:
        assert name == "benchmarks.transfer"
        return fake

    monkeypatch.setattr(entry.importlib, "import_module", load)
    assert entry.main(["transfer", "--", "--rounds", "1", "--skip-rate"]) == 0
    assert seen == [["--rounds", "1", "--skip-rate"]]
    assert transfer.recorded_command(seen[0]) == (
        "python -m benchmarks transfer --rounds 1 --skip-rate")


def test_a_value_that_equals_a_benchmarks_name_stays_an_argument(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, list[str]]] = []

    def load(name: str) -> Any:
        return types.SimpleNamespace(main=lambda argv: seen.append((name, argv)) or 0)

    monkeypatch.setattr(entry.importlib, "import_module", load)
    assert entry.main(["peer", "--", "--out", "transfer"]) == 0
    assert entry.main(["--rounds", "3", "--tools", "peer"]) == 0
    assert seen == [("benchmarks.peer", ["--out", "transfer"]),
                    ("benchmarks.transfer", ["--rounds", "3", "--tools", "peer"])]
