"""The s3:// store's enterprise settings: server-side encryption, a private CA, addressing.

Pure apart from `from_env` reading a mapping. Set by the policy's
`storage.encryption`, `storage.caBundle` and `storage.addressingStyle`
(the webhook turns them into the environment below), or by hand:

    CKPTDRAIN_S3_SSE             "" (the bucket's default), SSE-S3 or SSE-KMS
    CKPTDRAIN_S3_SSE_KMS_KEY_ID  with SSE-KMS: the key id or ARN ("" = the
                                 store's default KMS key)
    CKPTDRAIN_S3_CA_BUNDLE       path of a PEM file of CAs to trust for the
                                 endpoint (a private CA), instead of the
                                 system's
    CKPTDRAIN_S3_ADDRESSING      auto, path or virtual (bucket in the path or
                                 in the host name)

Encryption is asked for on every object we create (PutObject and
CreateMultipartUpload; parts inherit it): a bucket without a default
encryption still gets encrypted checkpoints, and a store that cannot do
what was asked refuses the write, never stores it in the clear.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptdrain.contract.env import Env
from ckptdrain.errors import InvalidInput

SSE_MODES = {"SSE-S3": "AES256", "SSE-KMS": "aws:kms"}
ADDRESSING = ("auto", "path", "virtual")


@dataclass(frozen=True)
class S3Options:
    sse: str | None = None  # None, "SSE-S3" or "SSE-KMS"
    kms_key_id: str | None = None
    ca_bundle: str | None = None
    addressing: str | None = None  # None: path for custom endpoints, auto for AWS

    def __post_init__(self) -> None:
        if self.sse is not None and self.sse not in SSE_MODES:
            raise InvalidInput(Env.S3_SSE.value, "SSE-S3, SSE-KMS or empty", self.sse)
        if self.kms_key_id and self.sse != "SSE-KMS":
            raise InvalidInput(Env.S3_SSE_KMS_KEY_ID.value, "a key id only with SSE-KMS",
                               "(set)")
        if self.addressing is not None and self.addressing not in ADDRESSING:
            raise InvalidInput(Env.S3_ADDRESSING.value, "auto, path or virtual",
                               self.addressing)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> S3Options:
        def get(name: Env) -> str | None:
            return environ.get(name.value, "").strip() or None

        bundle = get(Env.S3_CA_BUNDLE)
        if bundle is not None and not Path(bundle).is_file():
            raise InvalidInput(Env.S3_CA_BUNDLE.value, "the path of a PEM file of CAs", bundle)
        return cls(sse=get(Env.S3_SSE), kms_key_id=get(Env.S3_SSE_KMS_KEY_ID),
                   ca_bundle=bundle, addressing=get(Env.S3_ADDRESSING))

    def create_args(self) -> dict[str, Any]:
        """What PutObject and CreateMultipartUpload carry for encryption."""
        if self.sse is None:
            return {}
        args: dict[str, Any] = {"ServerSideEncryption": SSE_MODES[self.sse]}
        if self.kms_key_id:
            args["SSEKMSKeyId"] = self.kms_key_id
        return args

    def addressing_style(self, custom_endpoint: bool) -> str:
        # Custom endpoints (MinIO, SeaweedFS, Ceph) rarely have wildcard DNS
        # for virtual-hosted buckets; AWS itself picks what it needs.
        if self.addressing is not None:
            return self.addressing
        return "path" if custom_endpoint else "auto"
