"""A MinIO user per tenant, as a platform sets one up: a canned policy, a
user, the policy attached, through MinIO's admin REST API signed with the
root credentials (tests/support/s3servers.py starts the server; `mc` is not
there). Only the three calls the tests need.

    admin = MinioAdmin(server)
    admin.add_policy("team-a", document)
    admin.add_user(access_key, secret_key)
    admin.attach("team-a", access_key)

add-user's body is encrypted with the root secret key as madmin-go's
EncryptData does it: salt(32) | AEAD id(1) | nonce(8) | sio-go stream. The
server decrypts all three of its ids; PBKDF2-SHA256 with AES-256-GCM is the
one the standard library and `cryptography` make without argon2.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .s3servers import S3Server

ADMIN = "/minio/admin/v3"
_PBKDF2_AES_GCM = 0x02  # madmin-go's pbkdf2AESGCM
_PBKDF2_COST = 8192  # madmin-go's pbkdf2Cost


def encrypt_for_admin(password: str, data: bytes) -> bytes:
    """madmin-go's EncryptData (PBKDF2 id) for a body under sio-go's 16 KiB
    buffer: one final fragment. sio-go seals an empty message under
    sequence 0 as the associated data of every fragment (flag 0x00, or 0x80
    for the final one) and numbers fragments from 1 in the nonce's last 4
    bytes, little-endian."""
    if len(data) >= 1 << 14:
        raise ValueError(f"admin body of {len(data)} bytes: expected under 16 KiB")
    salt, nonce = os.urandom(32), os.urandom(8)
    aead = AESGCM(hashlib.pbkdf2_hmac("sha256", password.encode(), salt, _PBKDF2_COST, 32))
    tag = aead.encrypt(nonce + struct.pack("<I", 0), b"", None)
    sealed = aead.encrypt(nonce + struct.pack("<I", 1), data, b"\x80" + tag)
    return salt + bytes([_PBKDF2_AES_GCM]) + nonce + sealed


class MinioAdmin:
    """MinIO's admin API as the server's root user."""

    def __init__(self, server: S3Server) -> None:
        self.server = server

    def _call(self, path: str, query: dict[str, str], body: bytes = b"") -> None:
        url = f"{self.server.endpoint_url}{ADMIN}/{path}?{urllib.parse.urlencode(query)}"
        request = AWSRequest(method="PUT", url=url, data=body)
        S3SigV4Auth(Credentials(self.server.access_key, self.server.secret_key), "s3",
                    self.server.region).add_auth(request)
        prepared = request.prepare()
        sent = urllib.request.Request(url, data=body, method="PUT",
                                      headers=dict(prepared.headers.items()))
        try:
            urllib.request.urlopen(sent, timeout=30).read()
        except urllib.error.HTTPError as error:
            # The server's JSON error names what it refused; it holds no secret.
            raise RuntimeError(f"MinIO admin {path}: {error.code} "
                               f"{error.read()[:300]!r}") from None

    def add_policy(self, name: str, document: dict[str, Any]) -> None:
        self._call("add-canned-policy", {"name": name}, json.dumps(document).encode())

    def add_user(self, access_key: str, secret_key: str) -> None:
        body = json.dumps({"secretKey": secret_key, "status": "enabled"}).encode()
        self._call("add-user", {"accessKey": access_key},
                   encrypt_for_admin(self.server.secret_key, body))

    def attach(self, policy: str, user: str) -> None:
        self._call("set-user-or-group-policy",
                   {"policyName": policy, "userOrGroup": user, "isGroup": "false"})
