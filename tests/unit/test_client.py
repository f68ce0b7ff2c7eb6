"""The trainer client: temp + rename publishing, the request/ack channel, restore result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptdrain.client import CONTROL_DIR, REQUEST_FILE, Client, write_json_atomic
from ckptdrain.node.steps import completed_steps


def test_half_written_step_is_invisible_until_complete(tmp_path: Path) -> None:
    client = Client(tmp_path)
    d = client.begin(7)
    (d / "a.bin").write_bytes(b"x" * 10)
    assert completed_steps(tmp_path) == []
    client.complete(7)
    assert completed_steps(tmp_path) == [7]
    assert (tmp_path / "step-7" / "a.bin").read_bytes() == b"x" * 10


def test_completing_a_published_step_keeps_the_published_copy(tmp_path: Path) -> None:
    client = Client(tmp_path)
    (client.begin(1) / "f").write_text("first")
    client.complete(1)
    (client.begin(1) / "f").write_text("second")
    client.complete(1)
    assert (tmp_path / "step-1" / "f").read_text() == "first"
    assert not client.temp_dir(1).exists()


def test_request_is_pending_until_a_step_is_completed(tmp_path: Path) -> None:
    client = Client(tmp_path)
    assert client.checkpoint_requested() is None
    write_json_atomic(tmp_path / CONTROL_DIR / REQUEST_FILE,
                      {"seq": 1, "reason": "schedule", "at": 0})
    request = client.checkpoint_requested()
    assert request is not None and request.seq == 1
    client.begin(3)
    client.complete(3)
    assert client.checkpoint_requested() is None
    # The acknowledgement survives a trainer restart.
    assert Client(tmp_path).checkpoint_requested() is None
    write_json_atomic(tmp_path / CONTROL_DIR / REQUEST_FILE, {"seq": 2, "reason": "sigterm"})
    assert Client(tmp_path).checkpoint_requested().reason == "sigterm"  # type: ignore[union-attr]


def test_restored_reads_the_result_file(tmp_path: Path) -> None:
    client = Client(tmp_path)
    assert client.restored() is None
    (tmp_path / "restore.json").write_text(json.dumps({"fresh_start": True}))
    assert client.restored() is None
    (tmp_path / "step-5").mkdir()
    (tmp_path / "restore.json").write_text(json.dumps({
        "fresh_start": False, "step": 5, "tier": "local", "path": str(tmp_path / "step-5"),
        "bytes": 10, "seconds": 0.5}))
    restored = client.restored()
    assert restored is not None and (restored.step, restored.tier) == (5, "local")


def test_restored_finds_the_step_by_name_beside_the_result(tmp_path: Path) -> None:
    """Restore may see the work dir at another path than the trainer (through
    the local tier's volume): the step's name beside restore.json wins."""
    (tmp_path / "step-7").mkdir()
    (tmp_path / "restore.json").write_text(json.dumps({
        "fresh_start": False, "step": 7, "tier": "global", "name": "step-7",
        "path": "/ckptdrain/local/work-0/step-7", "bytes": 1, "seconds": 0.1}))
    restored = Client(tmp_path).restored()
    assert restored is not None and restored.path == tmp_path / "step-7"
    # A name that is not the result's step is not trusted: the path decides,
    # and a missing one is no restore (the step in the work dir is then the
    # trainer's own save, as after a restart in place).
    (tmp_path / "restore.json").write_text(json.dumps({
        "fresh_start": False, "step": 7, "tier": "global", "name": "../elsewhere",
        "path": "/nonexistent/step-7"}))
    restored = Client(tmp_path).restored()
    assert restored is not None and restored.tier == "work"


def test_env_names_the_work_dir(tmp_path: Path) -> None:
    client = Client(environ={"CKPTDRAIN_WORK_DIR": str(tmp_path),
                             "CKPTDRAIN_RESTORE_RESULT": str(tmp_path / "r.json")})
    assert client.step_dir(2) == tmp_path / "step-2"
    assert client.restore_result == tmp_path / "r.json"


def test_outside_a_pod_the_client_refuses_rather_than_create_a_work_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptdrain import client as client_module
    from ckptdrain.errors import InvalidInput

    default = tmp_path / "ckptdrain" / "work"
    monkeypatch.setattr(client_module, "DEFAULT_WORK_DIR", str(default))
    with pytest.raises(InvalidInput, match="CKPTDRAIN_WORK_DIR: expected the work directory"):
        Client(environ={})
    assert not default.exists()
    default.mkdir(parents=True)  # in a pod: the volume is mounted there
    assert Client(environ={}).work_dir == default
    assert Client(environ={"CKPTDRAIN_WORK_DIR": str(tmp_path)}).work_dir == tmp_path
