"""e2e/deps/csi-stubs.sh decides by its stamp and the generated files alone
whether the CSI stubs are current: a Python without grpcio-tools (an image
build's) accepts current stubs, and is refused, with what to run, only when
they must be regenerated. Run on a copy of the script in a scratch repo
layout: nothing is fetched or compiled here.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "e2e" / "deps" / "csi-stubs.sh"
GENERATED = ("__init__.py", "csi_pb2.py", "csi_pb2.pyi", "csi_pb2_grpc.py",
             "pluginregistration_pb2.py", "pluginregistration_pb2.pyi",
             "pluginregistration_pb2_grpc.py")


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A repo layout holding the script and a full set of stub files."""
    (tmp_path / "e2e" / "deps").mkdir(parents=True)
    shutil.copy(SCRIPT, tmp_path / "e2e" / "deps" / "csi-stubs.sh")
    stubs = tmp_path / "operator" / "ckptdrain" / "csi" / "stubs"
    stubs.mkdir(parents=True)
    for name in GENERATED:
        (stubs / name).write_text("# generated\n")
    # A Python without grpcio-tools: every call to it fails.
    no_tools = tmp_path / "python-without-tools"
    no_tools.write_text("#!/bin/sh\nexit 1\n")
    no_tools.chmod(0o755)
    return tmp_path


def stamp(scratch: Path, text: str) -> None:
    (scratch / "operator" / "ckptdrain" / "csi" / "stubs" / ".stamp").write_text(text + "\n")


def run(scratch: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(scratch / "e2e" / "deps" / "csi-stubs.sh"),
         str(scratch / "python-without-tools")],
        capture_output=True, text=True, timeout=60)


def script_hash() -> str:
    return hashlib.sha256(SCRIPT.read_bytes()).hexdigest()[:16]


def test_current_stubs_need_no_grpcio_tools(scratch: Path) -> None:
    stamp(scratch, f"{script_hash()} grpcio-tools 1.85.1")
    done = run(scratch)
    assert done.returncode == 0, done.stderr


def test_a_missing_stub_file_is_regenerated_not_trusted(scratch: Path) -> None:
    stamp(scratch, f"{script_hash()} grpcio-tools 1.85.1")
    (scratch / "operator" / "ckptdrain" / "csi" / "stubs" / "csi_pb2.py").unlink()
    done = run(scratch)
    assert done.returncode == 1
    assert "missing: csi_pb2.py" in done.stderr
    assert "has no grpcio-tools: run `make venv`" in done.stderr


def test_stubs_from_other_pins_are_regenerated(scratch: Path) -> None:
    stamp(scratch, "0123456789abcdef grpcio-tools 1.85.1")
    done = run(scratch)
    assert done.returncode == 1
    assert "made from other pins" in done.stderr and "make venv" in done.stderr
