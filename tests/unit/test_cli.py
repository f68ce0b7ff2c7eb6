"""`ckptdrain` as a user meets it: outputs, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptdrain import cli

EXAMPLE = ["size", "--parameters", "405B", "--interval", "15m", "--overlap", "10%"]


def test_size_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(EXAMPLE) == 0
    out = capsys.readouterr().out
    assert "63.0 GB/s" in out and "5.67 TB" in out and "1m30s" in out


def test_size_json_pins_63_gb_per_s(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*EXAMPLE, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["checkpoint_bytes"] == 5.67e12
    assert doc["required_bandwidth_bytes_per_second"] == pytest.approx(63e9, rel=1e-12)
    assert doc["drain_seconds"] == pytest.approx(90)


def test_size_with_caps_and_mtti(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["size", "--parameters", "405B", "--mtti", "150m", "--cap", "10GB/s",
            "--local-write-time", "30s", "--drainers", "4", "--json"]
    assert cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["binding_cap"] == "policy" and doc["bandwidth_constrained"]
    assert doc["local_interval_seconds"] == 900
    assert doc["per_drainer_bandwidth_bytes_per_second"] == pytest.approx(2.5e9)


@pytest.mark.parametrize(("argv", "field"), [
    (["size", "--parameters", "405X", "--interval", "15m"], "--parameters"),
    (["size", "--parameters", "405B", "--interval", "soon"], "--interval"),
    (["size", "--parameters", "405B", "--interval", "15m", "--overlap", "150%"], "--overlap"),
    (["size", "--interval", "15m"], "--parameters"),
    (["push", "/nonexistent-dir-1", "file:///tmp/x", "--step", "1", "--rate", "fast"], "--rate"),
    (["pull", "ftp://x", "/tmp/d"], "uri"),
])
def test_bad_input_exits_2_naming_the_field(argv: list[str], field: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ckptdrain: error: ") and field in err
    assert "Traceback" not in err


def test_push_ls_pull_verify_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "step-12"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(300_000))
    uri = f"file://{tmp_path}/store"
    assert cli.main(["push", str(src), uri, "--part-size", "1MiB", "--json"]) == 0
    pushed = json.loads(capsys.readouterr().out)
    assert pushed["step"] == 12 and pushed["bytes"] == 300_000
    assert not (tmp_path / ".step-12.ckptdrain-journal").exists()
    assert cli.main(["ls", uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["complete"]
    assert cli.main(["pull", uri, str(tmp_path / "out"), "--step", "12", "-q"]) == 0
    assert (tmp_path / "out" / "w.bin").read_bytes() == (src / "w.bin").read_bytes()
    assert cli.main(["verify", uri]) == 0
    (tmp_path / "out" / "w.bin").write_bytes(b"tampered")
    capsys.readouterr()
    assert cli.main(["verify", str(tmp_path / "out"), "--against", uri]) == 4
    assert "w.bin" in capsys.readouterr().out


def test_pull_from_an_empty_store_exits_5(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["pull", f"file://{tmp_path}/empty", str(tmp_path / "d")]) == 5
    assert "no complete" in capsys.readouterr().err


def test_help_documents_exit_codes_and_version() -> None:
    out = subprocess.run([sys.executable, "-m", "ckptdrain", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for code in ("0 ", "2 ", "3 ", "4 ", "5 ", "130"):
        assert code in out
    version = subprocess.run([sys.executable, "-m", "ckptdrain", "--version"],
                             capture_output=True, text=True, check=True).stdout
    assert version.startswith("ckptdrain ")
