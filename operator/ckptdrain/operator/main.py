"""`ckptdrain operator`: load the config, start metrics, run Kopf.

`run(argv) -> int` is what the CLI calls; `python -m ckptdrain.operator.main`
works too (the tests start it that way).
"""

from __future__ import annotations

import argparse
import os
import sys

from ckptdrain.errors import InvalidInput


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", help="watch one namespace (default: all, or "
                        "CKPTDRAIN_NAMESPACE)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, "
                        "then KUBECONFIG)")
    parser.add_argument("--standalone", action="store_true",
                        help="no peering: run even if another replica is active")
    parser.add_argument("--verbose", action="store_true")


def run(argv: list[str] | None = None) -> int:
    """Parse `argv` and run until stopped (see run_parsed)."""
    parser = argparse.ArgumentParser(prog="ckptdrain operator",
                                     description="Run the ckptdrain operator (Kopf).")
    add_arguments(parser)
    return run_parsed(parser.parse_args(argv))


def run_parsed(args: argparse.Namespace) -> int:
    """Run until stopped; 0 on a clean stop, 2 on a bad configuration."""
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    if args.namespace:
        os.environ["CKPTDRAIN_NAMESPACE"] = args.namespace
    from ckptdrain.operator import config
    try:
        cfg = config.from_env()
    except InvalidInput as error:
        print(f"ckptdrain operator: {error}", file=sys.stderr)
        return error.exit_code
    from ckptdrain import kubeclient
    from ckptdrain.errors import CkptdrainError
    try:
        kubeclient.check_reachable()  # before Kopf: it would retry in tracebacks
    except CkptdrainError as error:
        print(f"ckptdrain operator: {error}", file=sys.stderr)
        return error.exit_code

    from ckptdrain.operator import heap
    heap.start()  # before the threads that allocate: see heap.py

    import kopf
    from prometheus_client import start_http_server

    # Importing handlers, the sweeps and webhook registers their Kopf handlers.
    from ckptdrain.operator import class_events, handlers  # noqa: F401
    from ckptdrain.operator.admission import census, conflict_sweep, sweep, webhook  # noqa: F401
    from ckptdrain.operator.apiserver import leadership
    from ckptdrain.operator.recency import publish  # noqa: F401

    if cfg.metrics_port:
        start_http_server(cfg.metrics_port)
    kopf.configure(verbose=args.verbose)
    scope: dict[str, object] = (
        {"namespaces": [cfg.namespace]} if cfg.namespace else {"clusterwide": True})
    kopf.run(
        standalone=args.standalone or None,
        peering_name=cfg.peering,
        # Our id in the peering object, so that leadership.active() finds us.
        identity=leadership.IDENTITY,  # type: ignore[arg-type]
        liveness_endpoint=f"http://0.0.0.0:{cfg.health_port}/healthz"
        if cfg.health_port else None,
        memo=kopf.Memo(config=cfg),
        **scope,  # type: ignore[arg-type]
    )
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
