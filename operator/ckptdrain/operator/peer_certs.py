"""Per-policy peer-tier credentials (docs/peer-tier.md): a CA made for one
policy alone and one client-and-server certificate it signed, whose common
name is the policy. Pure but for key generation (the clock is passed in).

The pods' Secret holds `ca.crt`, `tls.crt` and `tls.key` (peer/tls.py reads
them); `ca.key` stays in the operator's own Secret.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ckptdrain.operator import certs

CERT_LIFETIME = timedelta(days=365)
#: What a pod of the policy mounts (never the CA key).
POD_KEYS = ("ca.crt", "tls.crt", "tls.key")


def new_material(policy_id: str, now: datetime) -> dict[str, bytes]:
    """A fresh CA for `policy_id` and one client-and-server certificate it signed:
    the keys of the policy's peer Secret, plus `ca.key` (for the operator only)."""
    ca, ca_key_pem = certs.new_ca(f"ckptdrain-peer-ca {policy_id}", now)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, policy_id)]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - certs.BACKDATE).not_valid_after(now + CERT_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return {
        "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
        "ca.key": ca_key_pem,
        "tls.crt": cert.public_bytes(serialization.Encoding.PEM),
        "tls.key": key.private_bytes(serialization.Encoding.PEM,
                                     serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()),
    }


def write_material(directory: Path, material: dict[str, bytes]) -> None:
    """Write the pod's files (never the CA key) as a mounted Secret would hold them."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in POD_KEYS:
        path = directory / name
        path.write_bytes(material[name])
        path.chmod(0o600)


