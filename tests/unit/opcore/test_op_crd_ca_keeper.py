"""The CRD caBundle keeper when the read is not a CRD's JSON (a proxy's
error page, a truncated body): reported as missing and retried, never an
exception that would end the thread that also renews the certificate.
Against a real apiserver: tests/cluster/conversion/test_conversion_ca_keeper.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from ckptdrain.operator.tls import webhook_certs
from ckptdrain.operator.tls.webhook_address import WebhookAddress


class _Crds:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def read_custom_resource_definition(self, name: str, **_: Any) -> Any:
        return SimpleNamespace(data=self.body)


@pytest.mark.parametrize("body", [b"<html>bad gateway</html>", b"[1, 2]", b'"x"', b""])
def test_a_read_that_is_not_a_crd_is_missing_not_fatal(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, body: bytes) -> None:
    monkeypatch.setattr(webhook_certs, "_crds", lambda: _Crds(body))
    keeper = webhook_certs.CrdCaKeeper(WebhookAddress("ckptdrain-webhook.ckptdrain.svc", 443),
                                       logging.getLogger("test"))
    with caplog.at_level(logging.WARNING):
        assert keeper.keep(b"-----BEGIN CERTIFICATE-----") is webhook_certs.CrdCa.MISSING
    assert "CustomResourceDefinition" in caplog.text
    assert webhook_certs.next_check_s(False, webhook_certs.CrdCa.MISSING) < webhook_certs.CHECK_S
