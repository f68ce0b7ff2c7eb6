"""operator/main.py: a bad configuration stops the start with one clear line."""

from __future__ import annotations

import pytest

from ckptdrain.operator import main


def test_bad_config_exits_2_naming_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CKPTDRAIN_CLUSTER_BANDWIDTH", "fast")
    assert main.run([]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "CKPTDRAIN_CLUSTER_BANDWIDTH" in err and "fast" in err
