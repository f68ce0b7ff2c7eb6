"""Per-policy peer-tier credentials (docs/peer-tier.md): a CA made for one
policy alone and one client-and-server certificate it signed, whose common
name is the policy. Pure but for key generation (the clock is passed in).

The pods' Secret holds `ca.crt`, `tls.crt` and `tls.key` (peer/tls.py reads
them). The CA's key never reaches a pod: the operator keeps it in a Secret of
its own namespace (operator/peers/sync.py), so that it can sign the next
certificate with the same CA. Renewing with the same CA is what lets the
pods roll over one by one (the kubelet refreshes each pod's copy of the
Secret on its own schedule): old and new certificates chain to the one CA
every pod trusts, so no pair of agents ever disagrees.

    certificate  1 year, renewed when less than RENEW_BEFORE is left
    CA           10 years (operator/tls/certs.py); replaced only when it would
                 end before a new certificate (a new CA: pods trust it once
                 the kubelet has refreshed their Secret, see docs/peer-tier.md)
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ckptdrain.operator.tls import certs

CERT_LIFETIME = timedelta(days=365)
#: Renewed with a third of its life left: months for a failed renewal to be
#: seen (status, Event) and fixed before any pod's certificate ends.
RENEW_BEFORE = timedelta(days=120)
#: What a pod of the policy mounts (never the CA key).
POD_KEYS = ("ca.crt", "tls.crt", "tls.key")
#: What the operator keeps of the CA.
CA_KEYS = ("ca.crt", "ca.key")


def new_ca(policy_id: str, now: datetime) -> dict[str, bytes]:
    """A fresh CA for `policy_id`: `ca.crt` and `ca.key`."""
    ca, ca_key_pem = certs.new_ca(f"ckptdrain-peer-ca {policy_id}", now)
    return {"ca.crt": ca.public_bytes(serialization.Encoding.PEM), "ca.key": ca_key_pem}


def not_after(cert_pem: bytes) -> datetime:
    """When the (first) certificate in `cert_pem` ends (aware, UTC)."""
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


def renewal_due(ends: datetime | None, now: datetime) -> bool:
    """A certificate ending at `ends` (None: not known) must be renewed now."""
    return ends is None or ends - now <= RENEW_BEFORE


def ca_usable(ca: dict[str, bytes], now: datetime) -> bool:
    """`ca` can sign a certificate of the full lifetime (and is readable)."""
    try:
        ends = not_after(ca["ca.crt"])
        key = serialization.load_pem_private_key(ca["ca.key"], password=None)
    except (KeyError, ValueError, TypeError):
        return False
    return isinstance(key, ec.EllipticCurvePrivateKey) and ends - now > CERT_LIFETIME


def new_material(policy_id: str, now: datetime) -> dict[str, bytes]:
    """A fresh CA for `policy_id` and one client-and-server certificate it signed:
    the keys of the policy's peer Secret, plus `ca.key` (for the operator only)."""
    return issue(policy_id, new_ca(policy_id, now), now)


def issue(policy_id: str, ca_material: dict[str, bytes], now: datetime) -> dict[str, bytes]:
    """A new client-and-server certificate for `policy_id` signed by the CA in
    `ca_material` (`ca.crt`, `ca.key`): the pods' keys plus `ca.key`."""
    ca = x509.load_pem_x509_certificate(ca_material["ca.crt"])
    ca_key_pem = ca_material["ca.key"]
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the peer CA key is not an EC key")
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


