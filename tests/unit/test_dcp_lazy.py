"""`ckptdrain.dcp` imports without PyTorch: torch loads only when its names are used."""

from __future__ import annotations

import subprocess
import sys


def test_importing_ckptdrain_dcp_loads_no_torch() -> None:
    probe = ("import sys, ckptdrain.dcp\n"
             "print('torch' in sys.modules, ckptdrain.dcp.__all__)")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True).stdout
    assert out.startswith("False "), out


def test_an_unknown_name_is_an_attribute_error() -> None:
    import ckptdrain.dcp

    try:
        ckptdrain.dcp.nothing  # noqa: B018
    except AttributeError as err:
        assert "nothing" in str(err)
    else:
        raise AssertionError("ckptdrain.dcp.nothing resolved")
