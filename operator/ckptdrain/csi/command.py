"""`ckptdrain csi-node`: the CSI node driver (one privileged pod per node).

Runs until SIGTERM; exits 1 when kubelet reports that it could not register
the driver (the DaemonSet restarts it, and the pod's status shows it).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from ckptdrain.csi import config
from ckptdrain.errors import CkptdrainError

log = logging.getLogger("ckptdrain.csi")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        from ckptdrain.csi.server import Driver
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("ckptdrain.csi.stubs"):
            raise
        # Generated at build time, never in git: a checkout without them.
        print(f"ckptdrain csi-node: no gRPC stubs ({err.name}): run `make venv` "
              "(e2e/deps/csi-stubs.sh generates them)", file=sys.stderr)
        return 1
    from ckptdrain.csi.policies import (
        apiserver_classes,
        apiserver_resolver,
        policies_api,
        storage_api,
    )

    try:
        cfg = config.load(args)
        api = policies_api()
        driver = Driver(cfg, apiserver_resolver(api), list_classes=apiserver_classes(api),
                        storage_api=storage_api(api))
        driver.start()
    except (CkptdrainError, OSError) as err:
        print(f"ckptdrain csi-node: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 1)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    log.info("CSI driver %s serving %s; registration at %s; metrics on port %s; reclaim %s "
             "after %g s where no class says otherwise, scanning every %g s; free space "
             "published in namespace %s", cfg.name, cfg.csi_socket,
             cfg.registration_socket, cfg.metrics_port or "(none)", cfg.reclaim.policy,
             cfg.reclaim.grace_s, cfg.scan_interval_s, cfg.capacity_namespace or "(none)")
    # Wake on a stop signal or on kubelet's refusal, whichever comes first.
    while not stop.wait(1.0) and not driver.registration.failed.is_set():
        pass
    driver.stop()
    if driver.registration.failed.is_set():
        print(f"ckptdrain csi-node: kubelet did not register {cfg.name}: "
              f"{driver.registration.failure}", file=sys.stderr)
        return 1
    return 0
