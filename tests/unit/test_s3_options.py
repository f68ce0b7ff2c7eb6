"""Enterprise S3 settings (store/s3_options.py): parsed from the environment, checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptdrain.errors import InvalidInput
from ckptdrain.store.s3 import S3Store
from ckptdrain.store.s3_options import S3Options


def test_from_env_reads_every_setting(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    o = S3Options.from_env({"CKPTDRAIN_S3_SSE": "SSE-KMS", "CKPTDRAIN_S3_SSE_KMS_KEY_ID": "k1",
                            "CKPTDRAIN_S3_CA_BUNDLE": str(ca),
                            "CKPTDRAIN_S3_ADDRESSING": "virtual"})
    assert o == S3Options("SSE-KMS", "k1", str(ca), "virtual")
    assert o.create_args() == {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "k1"}
    assert S3Options.from_env({}) == S3Options()
    assert S3Options().create_args() == {}
    assert S3Options(sse="SSE-S3").create_args() == {"ServerSideEncryption": "AES256"}


@pytest.mark.parametrize(("env", "field"), [
    ({"CKPTDRAIN_S3_SSE": "aes"}, "CKPTDRAIN_S3_SSE"),
    ({"CKPTDRAIN_S3_SSE_KMS_KEY_ID": "k"}, "CKPTDRAIN_S3_SSE_KMS_KEY_ID"),
    ({"CKPTDRAIN_S3_CA_BUNDLE": "/no/such/ca.pem"}, "CKPTDRAIN_S3_CA_BUNDLE"),
    ({"CKPTDRAIN_S3_ADDRESSING": "dns"}, "CKPTDRAIN_S3_ADDRESSING"),
])
def test_bad_settings_name_their_variable(env: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        S3Options.from_env(env)
    assert err.value.field == field


def test_the_addressing_style_reaches_the_client() -> None:
    def style(options: S3Options, endpoint: str | None) -> str:
        store = S3Store("b", endpoint_url=endpoint, region="us-east-1", access_key="a",
                        secret_key="s", options=options)
        return str(store._client.meta.config.s3["addressing_style"])

    assert style(S3Options(), "http://127.0.0.1:9000") == "path"
    assert style(S3Options(), None) == "auto"
    assert style(S3Options(addressing="virtual"), "https://s3.example.com") == "virtual"
    assert style(S3Options(addressing="path"), None) == "path"


def test_the_agent_config_validates_them_at_start_naming_the_variable(tmp_path: Path) -> None:
    from ckptdrain.node import config as node_config

    base = {"CKPTDRAIN_STORE_URI": "s3://bucket/p", "CKPTDRAIN_WORK_DIR": str(tmp_path)}
    cfg = node_config.load(environ={**base, "CKPTDRAIN_S3_SSE": "SSE-S3"})
    assert cfg.s3_options == S3Options(sse="SSE-S3")
    with pytest.raises(InvalidInput) as err:
        node_config.load(environ={**base, "CKPTDRAIN_S3_ADDRESSING": "dns"})
    assert err.value.field == "CKPTDRAIN_S3_ADDRESSING"
