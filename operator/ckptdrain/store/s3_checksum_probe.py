"""Whether an S3-compatible server checks x-amz-checksum-crc32c on PutObject.

Whole objects (manifests, files up to a part size) go with the CRC32C the
drain took as it read them, in x-amz-checksum-crc32c: AWS S3, MinIO and
SeaweedFS refuse a body that does not match it. A server that ignores the
header would store any bytes, and report back our CRC as if it had checked
it, so once per store a process asks: it puts a few bytes under a name no
key can take, with a CRC32C that is deliberately wrong. Refused: the
server checks it. Stored: it does not, the probe object is deleted, and
whole objects go with Content-MD5 instead (checked by every S3 server we
know of, at ~1.7 core-s per GB it covers).

The probe is sent as the store's real writes are (the policy's encryption
asked for: a bucket policy that requires it would refuse it otherwise), and
it never fails a write the store would take: an answer that is neither a
refusal for the checksum nor a success (access denied, another 4xx) says
nothing about checksums, and the write goes with Content-MD5 while the next
one asks again. A store that does not answer (throttling past the retries,
unreachable) fails the write as it is: the write would fail the same way,
and asking it twice as often would not help it recover.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from ckptdrain import checksum
from ckptdrain.errors import CkptdrainError, StoreUnreachable
from ckptdrain.paths import RESERVED_PREFIX
from ckptdrain.store.s3_errors import DIGEST_CODES

log = logging.getLogger(__name__)

PROBE_DIR = RESERVED_PREFIX + "probe"
_BODY = b"ckptdrain checksum probe"


def probe_key(prefix: str) -> str:
    """A fresh key under `prefix` that no checkpoint key can be (paths.check_key)."""
    name = f"{PROBE_DIR}/{secrets.token_hex(16)}"
    return f"{prefix}/{name}" if prefix else name


def server_checks_crc32c(call: Callable[..., Any], full_key: str, endpoint: str,
                         create_args: dict[str, Any] | None = None) -> bool | None:
    """Put `_BODY` at `full_key` with a wrong CRC32C: True if the server refused
    it for the checksum, False if it stored it, None if it answered otherwise
    (unknown: ask again later); StoreUnreachable when it does not answer.

    `call(op, handled=codes, **kwargs)` is the store's request (a ClientError
    whose code is in `handled` comes back instead of being raised)."""
    wrong = checksum.to_b64(checksum.crc32c(_BODY) ^ 0xFFFFFFFF)
    try:
        answer = call("put_object", handled=DIGEST_CODES, Key=full_key, Body=_BODY,
                      ContentLength=len(_BODY), ChecksumCRC32C=wrong, **(create_args or {}))
    except StoreUnreachable:
        raise
    except CkptdrainError as err:
        log.info("%s: the checksum probe got no answer about checksums (%s); this write "
                 "goes with Content-MD5", endpoint, type(err).__name__)
        return None
    if isinstance(answer, ClientError):
        return True
    with contextlib.suppress(Exception):  # a leftover of 24 bytes; the warning says why
        call("delete_object", Key=full_key)
    log.warning("%s stored a body whose x-amz-checksum-crc32c was wrong: it does not check "
                "that header, so whole objects go with Content-MD5 (it checks that)", endpoint)
    return False
