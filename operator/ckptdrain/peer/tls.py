"""Mutual TLS between the agents of one policy.

Each policy has a CA of its own and one certificate it signed, usable as
client and server, whose common name is the policy (`<namespace>/<name>`).
The operator makes them (operator/peers/certs.py) and keeps them in a
per-policy Secret mounted into that policy's pods only (`ca.crt`, `tls.crt`,
`tls.key`); the CA key stays in the operator's own Secret. Both sides
require the other's certificate to chain to that CA *and* to name the same
policy, so neither another policy's pods nor anything else on the network
can read or write a writer's copies.

Peers are dialled by pod IP, so host names are not checked: the per-policy
CA and the common name are the identity.

The operator renews the certificate months before it ends, and the kubelet
swaps the mounted files (one symlink, so all three at once). A context is
therefore built again whenever the files differ from those it was built
from: a server accepts, and a client dials, with the newest certificate,
without a restart. A half-swapped set that does not load keeps the last good
context until the next connection.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

from ckptdrain.errors import CkptdrainError, InvalidInput

FILES = ("ca.crt", "tls.crt", "tls.key")
log = logging.getLogger(__name__)
Stamp = tuple[tuple[int, int, int], ...]
#: (directory, purpose) → the stamp of the files last tried, and the last
#: context that loaded (None: none yet). A set of files that does not load is
#: tried once, not at every connection.
_contexts: dict[tuple[Path, ssl.Purpose], tuple[Stamp | None, ssl.SSLContext | None]] = {}
_contexts_lock = threading.Lock()


def _stamp(directory: Path) -> Stamp | None:
    """What identifies the files' current content (following the kubelet's
    symlinks); None when one is missing."""
    out = []
    for name in FILES:
        try:
            st = os.stat(directory / name)
        except OSError:
            return None
        out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


class PeerAuthError(CkptdrainError):
    """The other side is not an agent of this policy."""


@dataclass(frozen=True)
class PeerCredentials:
    """The mounted per-policy Secret and the policy it speaks for."""

    directory: Path
    policy_id: str

    def _context(self, purpose: ssl.Purpose) -> ssl.SSLContext:
        """The context for the files as they are now: built again when they
        changed since the last try (a renewed certificate). Files that do not
        load (mid-swap, a broken update) keep the last good context; with
        none, the error is raised."""
        key = (self.directory, purpose)
        stamp = _stamp(self.directory)
        with _contexts_lock:
            tried, good = _contexts.get(key, (None, None))
        if good is not None and tried == stamp:
            return good
        try:
            ctx = self._build(purpose)
        except (ssl.SSLError, OSError, InvalidInput):
            if good is None:
                raise
            if tried != stamp:
                log.warning("peer credentials in %s changed but do not load; keeping the "
                            "previous ones", self.directory)
                with _contexts_lock:
                    _contexts[key] = (stamp, good)
            return good
        # Files swapped while they were read: not remembered, tried again.
        settled = stamp is not None and stamp == _stamp(self.directory)
        with _contexts_lock:
            _contexts[key] = (stamp if settled else None, ctx)
        return ctx

    def _build(self, purpose: ssl.Purpose) -> ssl.SSLContext:
        missing = [n for n in FILES if not (self.directory / n).is_file()]
        if missing:
            raise InvalidInput("peer credentials", f"{', '.join(FILES)} in {self.directory}",
                               f"missing {', '.join(missing)}")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if purpose == ssl.Purpose.CLIENT_AUTH
                             else ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.check_hostname = False  # dialled by pod IP; the CA and CN are the identity
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=str(self.directory / "ca.crt"))
        ctx.load_cert_chain(str(self.directory / "tls.crt"), str(self.directory / "tls.key"))
        return ctx

    def server_context(self) -> ssl.SSLContext:
        return self._context(ssl.Purpose.CLIENT_AUTH)

    def client_context(self) -> ssl.SSLContext:
        return self._context(ssl.Purpose.SERVER_AUTH)

    def check_peer(self, sock: ssl.SSLSocket) -> None:
        """Raise PeerAuthError unless the verified peer certificate names this policy."""
        cert = sock.getpeercert()
        names = [value for rdn in (cert or {}).get("subject", ()) for key, value in rdn
                 if key == "commonName"]
        if names != [self.policy_id]:
            raise PeerAuthError(f"peer certificate is for {names or 'no policy'}, "
                                f"not {self.policy_id}")
