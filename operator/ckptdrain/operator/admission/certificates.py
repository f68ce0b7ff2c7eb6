"""The admission server's TLS context (admission/server.py), made again
when the certificate files change: tls/webhook_certs.py renews them in
place, and a mounted Secret changes under the process. With a client CA
(CKPTDRAIN_WEBHOOK_CLIENT_CA), a certificate a client presents must be
signed by it; whether one is demanded is the server's business."""

from __future__ import annotations

import hashlib
import logging
import ssl
import threading
import time
from pathlib import Path

log = logging.getLogger("ckptdrain.admission")

#: How often the certificate files are read for a renewal (tls/webhook_certs.py
#: renews them in place; a mounted Secret changes under us).
CERT_CHECK_S = 30.0


class Certificates:
    """The TLS context of new connections, made again when the files change
    (the client CA bundle's too, when one is given)."""

    def __init__(self, cert: str, key: str, client_ca: str | None = None) -> None:
        self.cert, self.key, self.client_ca = cert, key, client_ca
        self._digest = b""
        self._context = self._load()

    def _read_digest(self) -> bytes:
        files = [self.cert, self.key] + ([self.client_ca] if self.client_ca else [])
        return hashlib.sha256(b"".join(Path(f).read_bytes() for f in files)).digest()

    def _load(self) -> ssl.SSLContext:
        digest = self._read_digest()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        # No client-started renegotiation (TLS 1.2): a new handshake on the
        # client's say costs the server and serves no client of ours.
        context.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
        if self.client_ca:
            # Optional at the handshake, so that the conversion path (no
            # client certificate from the apiserver) still connects; one that
            # is presented must verify. Admission paths demand one (Handler).
            context.verify_mode = ssl.CERT_OPTIONAL
            context.load_verify_locations(cafile=self.client_ca)
        self._digest = digest
        return context

    def context(self) -> ssl.SSLContext:
        return self._context

    def check(self) -> bool:
        """Load the files again if they changed; True if they did."""
        try:
            if self._read_digest() == self._digest:
                return False
            self._context = self._load()
        except (OSError, ssl.SSLError) as error:  # caught mid-write: the next check
            log.warning("admission: reading the certificate files failed (%s)", error)
            return False
        log.info("admission: serving the renewed certificate")
        return True

    def follow(self) -> None:
        """Check the files every CERT_CHECK_S in a daemon thread."""
        def loop() -> None:
            while True:
                time.sleep(CERT_CHECK_S)
                self.check()
        threading.Thread(target=loop, name="ckptdrain-admission-tls", daemon=True).start()
