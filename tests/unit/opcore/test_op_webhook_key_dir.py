"""The webhook's certificate and key live in a private directory that goes
with the process: an operator started and stopped (a developer's run, or the
hundreds a test run starts) leaves no private key behind in /tmp."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import json, os, stat, sys
from pathlib import Path
from ckptdrain.operator.admission import webhook
cert, key = webhook._self_signed("127.0.0.1")
directory = Path(key).parent
print(json.dumps({"dir": str(directory), "mode": stat.S_IMODE(directory.stat().st_mode),
                  "key": Path(key).is_file(), "cert": Path(cert).is_file()}))
sys.stdout.flush()
"""


def test_the_self_signed_key_is_private_while_the_process_runs_and_gone_after() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          check=True, env={**os.environ})
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert (seen["key"], seen["cert"], seen["mode"]) == (True, True, 0o700)
    assert not Path(seen["dir"]).exists()
