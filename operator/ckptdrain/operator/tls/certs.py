"""The webhook's certificates, managed by the operator itself: a CA and a
serving certificate kept in one Secret, renewed before they expire.

Pure (the clock is passed in): `plan(data, dns_names, now)` says what the
Secret must hold, or None when what it holds is good. Why in-process and not
Helm's `genCA`: a chart that makes certificates renders differently every
time (`helm template` under Argo CD or Flux mints a new CA on every sync and
restarts the operator), and `lookup` is empty in those renders. Kueue and
JobSet manage their webhook certificates in-process for the same reason.

The Secret's keys:

    ca.crt   the CA bundle the webhook configurations trust (PEM; during a
             CA renewal, the new CA followed by the old one)
    ca.key   the current CA's key (it signs only our serving certificate)
    tls.crt  the serving certificate for the webhook Service's DNS names
    tls.key  its key

Renewal: the serving certificate (1 year) is renewed 30 days before it
expires, or at once when it is unreadable, does not cover the names, or
does not chain to the CA. The CA (10 years) is renewed a year before it
expires; the old CA stays in the bundle until it expires, so replicas still
serving a certificate of the old CA are trusted meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CA_LIFETIME = timedelta(days=3650)
CA_RENEW_BEFORE = timedelta(days=365)
CERT_LIFETIME = timedelta(days=365)
CERT_RENEW_BEFORE = timedelta(days=30)
#: Certificates are valid from a little before `now`: clocks differ.
BACKDATE = timedelta(hours=1)
KEYS = ("ca.crt", "ca.key", "tls.crt", "tls.key")


@dataclass(frozen=True)
class Plan:
    data: dict[str, bytes]
    reason: str


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def new_ca(common_name: str, now: datetime) -> tuple[x509.Certificate, bytes]:
    """A self-signed CA that may sign end-entity certificates only."""
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + CA_LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                         False), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, _pem_key(key)


def new_serving(ca: x509.Certificate, ca_key_pem: bytes, dns_names: Sequence[str],
                now: datetime) -> tuple[x509.Certificate, bytes]:
    """A server certificate for `dns_names`, signed by `ca`."""
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key")
    key = _key()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + CERT_LIFETIME)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, _pem_key(key)


def _load(data: Mapping[str, bytes]) -> tuple[list[x509.Certificate], x509.Certificate,
                                              x509.Certificate] | None:
    """(bundle, current CA, serving cert), or None when anything is missing or unreadable."""
    if any(not data.get(k) for k in KEYS):
        return None
    try:
        bundle = x509.load_pem_x509_certificates(data["ca.crt"])
        serving = x509.load_pem_x509_certificate(data["tls.crt"])
        ca_key = serialization.load_pem_private_key(data["ca.key"], password=None)
        serialization.load_pem_private_key(data["tls.key"], password=None)
    except ValueError:
        return None
    current = next((c for c in bundle if c.public_key() == ca_key.public_key()), None)
    return None if current is None else (bundle, current, serving)


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return set()
    return set(san.value.get_values_for_type(x509.DNSName))


def plan(data: Mapping[str, bytes], dns_names: Sequence[str], now: datetime,
         common_name: str = "ckptdrain-webhook-ca") -> Plan | None:
    """What the Secret must hold now; None when it is good as it is."""
    loaded = _load(data)
    if loaded is None:
        ca, ca_key = new_ca(common_name, now)
        cert, key = new_serving(ca, ca_key, dns_names, now)
        reason = "created" if not any(data.get(k) for k in KEYS) else "unreadable, replaced"
        return Plan({"ca.crt": _pem(ca), "ca.key": ca_key, "tls.crt": _pem(cert),
                     "tls.key": key}, reason)
    bundle, ca, serving = loaded
    live = [c for c in bundle if c.not_valid_after_utc > now]  # expired CAs leave
    ca_pem, ca_key = b"".join(_pem(c) for c in live), data["ca.key"]
    reason = ""
    if ca.not_valid_after_utc - now <= CA_RENEW_BEFORE:
        # The new CA first; the old ones stay trusted until they expire.
        ca, ca_key = new_ca(common_name, now)
        ca_pem = _pem(ca) + ca_pem
        reason = "CA renewed"
    elif serving.not_valid_after_utc - now <= CERT_RENEW_BEFORE:
        reason = "certificate renewed before expiry"
    elif not set(dns_names) <= _names(serving):
        reason = "certificate renewed for new DNS names"
    elif not _signed_by(serving, ca):
        reason = "certificate not signed by the CA, renewed"
    if not reason:
        if len(live) == len(bundle):
            return None
        return Plan({**data, "ca.crt": ca_pem}, "expired CA dropped")
    cert, key = new_serving(ca, ca_key, dns_names, now)
    return Plan({"ca.crt": ca_pem, "ca.key": ca_key, "tls.crt": _pem(cert), "tls.key": key},
                reason)
