"""`ckptdrain demo` refuses a bad argument before it creates anything: no
temporary directory is left behind, and none is announced as kept."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from ckptdrain import cli

BAD = [
    (["--interval", "4"], "--interval"),
    (["--size", "lots"], "--size"),
    (["--overlap", "250%"], "--overlap"),
    (["--run", "forever"], "--run"),
    (["--grace", "-1s"], "--grace"),
    (["--global-every", "0"], "global"),
]


@pytest.mark.parametrize(("extra", "field"), BAD, ids=[" ".join(b[0]) for b in BAD])
def test_a_refused_argument_leaves_no_directory(extra: list[str], field: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert cli.main(["demo", "--mode", "sim", *extra]) == 2
    out, err = capsys.readouterr()
    assert field in err, err
    assert "kept" not in out, out
    assert list(tmp_path.iterdir()) == []
