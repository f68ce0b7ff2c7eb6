"""`ckptdrain peer`: the peer server, as a native sidecar of its own.

It must be up while *other* pods restore (a whole job restarts at once after
a node loss, and every pod's restore then asks the surviving nodes), so it
runs before the restore init container, not inside the agent, which starts
after restore. It serves this node's partner area (copies held for other
writers) and, read-only, this writer's own local tier; it accepts pushes
from the agents of the policy. Nothing else: it never captures or drains.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from ckptdrain.errors import CkptdrainError
from ckptdrain.node import config as node_config
from ckptdrain.peer import config as peer_config
from ckptdrain.peer.area import PartnerArea
from ckptdrain.peer.server import PeerServer, listen_address

log = logging.getLogger("ckptdrain.peer")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    node_config.add_arguments(parser, node_config.PEER_FIELDS)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = node_config.load(args)
        pcfg = peer_config.load(cfg.policy)
        if pcfg is None:
            print("ckptdrain peer: the peer tier is off (no CKPTDRAIN_PEER_CREDENTIALS)",
                  file=sys.stderr)
            return 2
        area = PartnerArea(cfg.local_dir, writers=cfg.writers, keep=pcfg.keep,
                           capacity=pcfg.capacity, own_writer=cfg.writer)
        area.remove_temps()
        server = PeerServer(listen_address(pcfg.port), area, pcfg.credentials)
    except (CkptdrainError, OSError) as err:
        print(f"ckptdrain peer: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 1)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    server.start()
    log.info("peer server started on :%d for writer %d of %s", server.port, cfg.writer,
             cfg.policy)
    stop.wait()
    # Whatever is being received is abandoned: the receiver never published it.
    server.shutdown()
    server.server_close()
    log.info("peer server stopped (%d bytes received)", server.received_bytes)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ckptdrain peer", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
