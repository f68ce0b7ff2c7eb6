"""The operator's webhook certificates: made once, kept while good, renewed
before expiry or when the names change, the CA renewed with the old one
kept in the bundle until it expires; garbage replaced, never trusted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cryptography import x509

from ckptdrain.operator.tls import certs

NAMES = ["ckptdrain-webhook.ckptdrain.svc", "ckptdrain-webhook.ckptdrain.svc.cluster.local"]
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _made() -> dict[str, bytes]:
    made = certs.plan({}, NAMES, T0)
    assert made is not None and made.reason == "created"
    return made.data


def _serving(data: dict[str, bytes]) -> x509.Certificate:
    return x509.load_pem_x509_certificate(data["tls.crt"])


def test_a_new_secret_gets_a_ca_and_a_serving_certificate_for_the_names() -> None:
    data = _made()
    (ca,) = x509.load_pem_x509_certificates(data["ca.crt"])
    serving = _serving(data)
    serving.verify_directly_issued_by(ca)
    san = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == NAMES
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_good_certificates_are_kept_as_they_are() -> None:
    data = _made()
    assert certs.plan(data, NAMES, T0) is None
    assert certs.plan(data, NAMES, T0 + timedelta(days=300)) is None


def test_the_serving_certificate_is_renewed_before_it_expires() -> None:
    data = _made()
    later = T0 + certs.CERT_LIFETIME - certs.CERT_RENEW_BEFORE + timedelta(days=1)
    renewed = certs.plan(data, NAMES, later)
    assert renewed is not None and renewed.reason == "certificate renewed before expiry"
    assert renewed.data["ca.crt"] == data["ca.crt"]  # same CA: no caBundle change
    assert _serving(renewed.data).not_valid_after_utc > later + timedelta(days=300)


def test_new_dns_names_renew_the_certificate() -> None:
    renewed = certs.plan(_made(), [*NAMES, "other.ckptdrain.svc"], T0)
    assert renewed is not None and "DNS names" in renewed.reason


def test_the_ca_is_renewed_and_the_old_one_stays_trusted_until_it_expires() -> None:
    data = _made()
    later = T0 + certs.CA_LIFETIME - certs.CA_RENEW_BEFORE + timedelta(days=1)
    renewed = certs.plan(data, NAMES, later)
    assert renewed is not None and renewed.reason == "CA renewed"
    new_ca, old_ca = x509.load_pem_x509_certificates(renewed.data["ca.crt"])
    assert old_ca == x509.load_pem_x509_certificate(data["ca.crt"])
    _serving(renewed.data).verify_directly_issued_by(new_ca)
    assert certs.plan(renewed.data, NAMES, later) is None
    # The serving certificate is renewed meanwhile, still under the new CA ...
    mid = old_ca.not_valid_after_utc - timedelta(days=10)
    again = certs.plan(renewed.data, NAMES, mid)
    assert again is not None and again.data["ca.crt"] == renewed.data["ca.crt"]
    # ... and once the old CA has expired it leaves the bundle, nothing else changes.
    after = old_ca.not_valid_after_utc + timedelta(days=1)
    dropped = certs.plan(again.data, NAMES, after)
    assert dropped is not None and dropped.reason == "expired CA dropped"
    assert x509.load_pem_x509_certificates(dropped.data["ca.crt"]) == [new_ca]
    assert dropped.data["tls.crt"] == again.data["tls.crt"]


def test_garbage_or_a_foreign_certificate_is_replaced() -> None:
    data = _made()
    broken = certs.plan({**data, "tls.crt": b"not a certificate"}, NAMES, T0)
    assert broken is not None and broken.reason == "unreadable, replaced"
    other = _made()
    foreign = certs.plan({**data, "tls.crt": other["tls.crt"]}, NAMES, T0)
    assert foreign is not None and foreign.reason == "certificate not signed by the CA, renewed"
    # A CA key that matches no CA in the bundle: start over.
    mismatched = certs.plan({**data, "ca.key": other["ca.key"]}, NAMES, T0)
    assert mismatched is not None and mismatched.reason == "unreadable, replaced"
