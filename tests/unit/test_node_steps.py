"""Step directory names: one canonical form, one parser, and the trainer's
client writes exactly what the agent reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptdrain.client import Client
from ckptdrain.node.steps import completed_steps, is_writing, parse_step_name, step_dir, step_name


@given(st.integers(0, 10**18 - 1))
def test_names_round_trip(step: int) -> None:
    assert parse_step_name(step_name(step)) == step


@pytest.mark.parametrize("name", ["step-007", "step-00", "step--1", "step-1.tmp", "step-",
                                  "Step-1", "step-1 ", "step-１", "step-" + "9" * 19])
def test_only_the_canonical_form_is_a_step(name: str) -> None:
    assert parse_step_name(name) is None


def test_the_client_publishes_what_the_agent_lists(tmp_path: Path) -> None:
    client = Client(tmp_path)
    (client.begin(12) / "a").write_bytes(b"1")
    assert is_writing(tmp_path) and completed_steps(tmp_path) == []
    client.complete(12)
    assert not is_writing(tmp_path)
    assert completed_steps(tmp_path) == [12] and step_dir(tmp_path, 12).is_dir()


def test_misnamed_and_plain_files_are_not_steps(tmp_path: Path) -> None:
    (tmp_path / "step-007").mkdir()
    (tmp_path / "step-8").write_bytes(b"not a directory")
    (tmp_path / "step-3").mkdir()
    assert completed_steps(tmp_path) == [3]
    assert completed_steps(tmp_path / "missing") == []
