"""A file:// store holding one small step, pushed by the CLI, for CLI tests."""

from __future__ import annotations

import os
from pathlib import Path

from ckptdrain import cli


def store_with_step(tmp_path: Path) -> str:
    """`file://<tmp_path>/store` holding step 3 (one file, a.bin, of 1000
    bytes), and an empty store directory `<tmp_path>/empty`."""
    src = tmp_path / "step-3"
    if not src.exists():  # pushed again by some cases: the same content, already committed
        src.mkdir()
        (src / "a.bin").write_bytes(os.urandom(1000))
    uri = f"file://{tmp_path}/store"
    assert cli.main(["push", str(src), uri, "-q", "--create"]) == 0
    (tmp_path / "empty").mkdir(exist_ok=True)
    return uri
