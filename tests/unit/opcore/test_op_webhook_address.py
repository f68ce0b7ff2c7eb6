"""Whether the CRD's conversion webhook calls this replica (tls/webhook_address.py),
so that two releases sharing the cluster never take turns setting their own
CA there, and how soon the keeper looks again (tls/webhook_certs.py). The
keeper against a real apiserver:
tests/cluster/conversion/test_conversion_ca_keeper.py."""

from __future__ import annotations

import pytest

from ckptdrain.operator.tls import webhook_certs
from ckptdrain.operator.tls.webhook_address import WebhookAddress, other_webhook
from ckptdrain.operator.tls.webhook_certs import CrdCa

#: What the chart sets CKPTDRAIN_WEBHOOK_HOST / _PORT to, release "train" in "ml-ops".
TRAIN = WebhookAddress("train-ckptdrain-webhook.ml-ops.svc", 9443)


def service(namespace: str, name: str) -> dict[str, object]:
    return {"service": {"namespace": namespace, "name": name, "path": "/convert",
                        "port": 443}, "caBundle": "Zm9v"}


@pytest.mark.parametrize("host", [
    "train-ckptdrain-webhook.ml-ops.svc", "train-ckptdrain-webhook.ml-ops.svc.cluster.local",
    "train-ckptdrain-webhook.ml-ops.svc.cluster.local."])
def test_the_releases_own_service_is_ours(host: str) -> None:
    ours = WebhookAddress(host, 9443)
    assert ours.service() == ("ml-ops", "train-ckptdrain-webhook")
    assert other_webhook(service("ml-ops", "train-ckptdrain-webhook"), ours) is None


@pytest.mark.parametrize(("namespace", "name"), [
    ("team-b", "train-ckptdrain-webhook"),  # the same release name elsewhere
    ("ml-ops", "other-ckptdrain-webhook"),  # another release beside it
    ("", "")])
def test_another_releases_service_is_not_ours(namespace: str, name: str) -> None:
    assert other_webhook(service(namespace, name), TRAIN) == f"Service {namespace}/{name}"


def test_a_replica_reached_by_address_owns_no_service() -> None:
    local = WebhookAddress("127.0.0.1", 9443)
    assert local.service() is None
    assert other_webhook(service("ml-ops", "train-ckptdrain-webhook"), local) == (
        "Service ml-ops/train-ckptdrain-webhook")
    assert local.describe() == "https://127.0.0.1:9443"
    assert TRAIN.describe() == "Service ml-ops/train-ckptdrain-webhook"


@pytest.mark.parametrize(("url", "ours"), [
    ("https://127.0.0.1:9443/convert", True),
    ("https://127.0.0.1:9444/convert", False),  # another server on the same machine
    ("https://10.0.0.7:9443/convert", False),
    ("https://127.0.0.1/convert", False),  # 443
    ("https://train-ckptdrain-webhook.ml-ops.svc/convert", False),  # not how we listen
    ("https://127.0.0.1:99999/convert", False),  # not a port: never ours
])
def test_a_url_is_ours_only_where_it_dials_this_server(url: str, ours: bool) -> None:
    local = WebhookAddress("127.0.0.1", 9443)
    assert (other_webhook({"url": url}, local) is None) is ours
    if not ours:
        assert other_webhook({"url": url}, local) == f"URL {url}"


def test_a_client_config_naming_nothing_is_not_ours() -> None:
    assert other_webhook({"caBundle": "Zm9v"}, TRAIN) == "neither a Service nor a URL"


@pytest.mark.parametrize(("configs_missing", "crd", "seconds"), [
    (0, CrdCa.IN_STEP, webhook_certs.CHECK_S),
    (0, CrdCa.SET, webhook_certs.CHECK_S),
    (0, CrdCa.MISSING, webhook_certs.MISSING_RETRY_S),  # applied any moment
    (1, CrdCa.IN_STEP, webhook_certs.MISSING_RETRY_S),
    # A right is granted by someone, not by retrying every second.
    (0, CrdCa.FORBIDDEN, webhook_certs.CHECK_S),
    (0, CrdCa.NOT_OURS, webhook_certs.CHECK_S),
    (0, CrdCa.NO_WEBHOOK, webhook_certs.CHECK_S),
])
def test_only_what_may_appear_any_moment_is_looked_at_again_soon(
        configs_missing: int, crd: CrdCa, seconds: float) -> None:
    assert webhook_certs.next_check_s(configs_missing, crd) == seconds
