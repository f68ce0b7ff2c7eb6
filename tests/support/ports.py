"""Free TCP ports for the servers the tests start.

A port found free by binding port 0 comes from the kernel's ephemeral
range, the same range it draws from for every outgoing connection: between
handing the number out and the server binding it, any client in the session
(an agent, boto3, the apiserver's own watches) may be given it as its local
port, and the server then fails with "address already in use". Ports are
drawn from below that range instead, where only listeners live, and never
handed out twice by one process.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000
_handed_out: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, outside
    the ephemeral range when there is room below it."""
    top = _ephemeral_start()
    if top - _LOWEST >= 1000:
        for _ in range(200):
            port = random.randrange(_LOWEST, top)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    _handed_out.add(port)
    return port
