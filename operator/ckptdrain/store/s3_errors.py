"""How the s3:// store names what went wrong: botocore's errors mapped onto
errors.py's taxonomy (and so onto exit codes), never echoing a secret.

Auth failures say only their code (servers may quote the access key id);
endpoints are shown with any userinfo redacted.
"""

from __future__ import annotations

import re
from typing import NoReturn

from botocore.exceptions import (
    ClientError,
    ConnectionError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
    SSLError,
)

from ckptdrain.errors import (
    BucketMissing,
    IntegrityError,
    ObjectMissing,
    StoreAccessDenied,
    StoreError,
    StoreUnreachable,
)

ACCESS_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AllAccessDisabled",
}
DIGEST_CODES = {"BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch", "InvalidChecksum"}
MISSING_KEY_CODES = {"NoSuchKey", "NotFound", "404"}


def redact_endpoint(url: str) -> str:
    return re.sub(r"://[^/@]*@", "://***@", url)


def raise_store_error(err: Exception, op: str, where: str, *, bucket: str, endpoint: str,
                      key: str | None) -> NoReturn:
    """Raise the errors.py exception for a botocore error met by `op` on
    `where` (an s3:// location); `endpoint` is already redacted."""
    if isinstance(err, (NoCredentialsError, PartialCredentialsError)):
        raise StoreAccessDenied(
            f"{op} {where}: no usable S3 credentials found; check the credentials "
            "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, profile, or workload identity)"
        ) from None
    if isinstance(err, SSLError):
        # Not "did not answer": it answered with a certificate we do not trust.
        raise StoreUnreachable(
            f"{op} {where}: TLS with {endpoint} failed (certificate not trusted or "
            "not for this host name); for a private CA set storage.caBundle "
            "(CKPTDRAIN_S3_CA_BUNDLE)") from err
    if isinstance(err, (ConnectionError, HTTPClientError)):
        raise StoreUnreachable(
            f"{op} {where}: endpoint {endpoint} did not answer "
            f"({type(err).__name__}); is it up and reachable?"
        ) from err
    if isinstance(err, ClientError):
        error = err.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code == "NoSuchBucket":
            raise BucketMissing(
                f"{op} {where}: bucket {bucket!r} does not exist at {endpoint}"
            ) from err
        if code in ACCESS_CODES or status == 403:
            # Server messages for auth failures can quote the access key
            # id; say only the code.
            raise StoreAccessDenied(
                f"{op} {where}: access denied by {endpoint} ({code or status}); "
                "check the credentials and that they may use this bucket"
            ) from None
        if code in MISSING_KEY_CODES or status == 404:
            raise ObjectMissing(key or where) from err
        if code in DIGEST_CODES:
            raise IntegrityError(
                f"{op} {where}: the store refused the bytes: checksum mismatch ({code})"
            ) from err
        if code in ("InvalidPart", "InvalidPartOrder", "EntityTooSmall"):
            raise IntegrityError(f"{op} {where}: {code}: {error.get('Message', '')}") from err
        if code == "NotImplemented" or status == 501:
            # Permanent: e.g. MinIO asked for SSE without a KMS configured.
            raise StoreError(
                f"{op} {where}: {endpoint} does not implement this request ({code or status}:"
                f" {error.get('Message', '')}); check storage.encryption") from err
        if status >= 500 or code in ("SlowDown", "ServiceUnavailable", "RequestTimeout"):
            raise StoreUnreachable(
                f"{op} {where}: endpoint {endpoint} is unavailable "
                f"(HTTP {status} {code}) after retries"
            ) from err
        raise StoreError(f"{op} {where}: {code or status}: {error.get('Message', '')}") from err
    raise StoreError(f"{op} {where}: {type(err).__name__}") from err
