"""Moving an object of the gs:// store to another storage class, in place.

GCS changes an object's class by rewriting it onto itself with the new
class: the copy happens on the server, in as many calls as it needs (each
answers with a token to go on, until `done`). The rewrite is pinned twice
to the generation that was read: the source is that generation, and the
destination is written only if it is still the live one, so a newer write
of the same name is never replaced by older bytes. The new generation must
report the same size and CRC32C as the one it replaces; if it does not,
the move fails loudly (restore verifies every byte against the manifest
in any case).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ckptdrain.errors import IntegrityError, ObjectMissing

if TYPE_CHECKING:
    import urllib3

#: Bytes GCS copies per call before it answers with a token: bounds each
#: request's time, so the agent's stop is never kept waiting on one.
REWRITE_CHUNK = 1 << 30
#: Calls one object's rewrite may take (GCS copies ~GB per call).
MAX_CALLS = 10_000


class GcsStorageClass:
    """GcsStore's storage-class change (not part of the Store protocol)."""

    bucket: str
    _base: str

    if TYPE_CHECKING:  # GcsStore's own helpers
        def _name(self, key: str) -> str: ...
        def _request(self, op: str, method: str, url: str, key: str | None, *,
                     body: Any = None, size: int = 0, headers: Any = None,
                     stream: bool = False, missing: bool = False
                     ) -> urllib3.BaseHTTPResponse | None: ...
        def _json(self, response: urllib3.BaseHTTPResponse, op: str, key: str | None
                  ) -> dict[str, Any]: ...
        def _stat(self, name: str, key: str | None) -> dict[str, Any] | None: ...

    def change_storage_class(self, key: str, size: int, storage_class: str) -> None:
        """Rewrite `key` (`size` bytes, as listed) onto itself in `storage_class`."""
        name = self._name(key)
        before = self._stat(name, key)
        if before is None:
            raise ObjectMissing(f"{key}: gone before its storage class could change")
        generation = str(before.get("generation", ""))
        path = f"{quote(self.bucket, safe='')}/o/{quote(name, safe='')}"
        url = (f"{self._base}/storage/v1/b/{path}/rewriteTo/b/{path}"
               f"?sourceGeneration={quote(generation, safe='')}"
               f"&ifGenerationMatch={quote(generation, safe='')}"
               f"&maxBytesRewrittenPerCall={REWRITE_CHUNK}")
        body = json.dumps({"storageClass": storage_class}).encode()
        token = ""
        for _ in range(MAX_CALLS):
            call = url + (f"&rewriteToken={quote(token, safe='')}" if token else "")
            response = self._request("rewrite", "POST", call, key, body=body, size=len(body),
                                     headers={"Content-Type": "application/json"},
                                     missing=True)
            if response is None:
                raise ObjectMissing(f"{key}: gone before its storage class could change")
            answer = self._json(response, "rewrite", key)
            if answer.get("done"):
                _check_same(key, before, answer.get("resource"))
                return
            token = str(answer.get("rewriteToken") or "")
            if not token:
                raise IntegrityError(f"rewrite {key}: GCS answered neither done nor a token "
                                     "to go on")
        raise IntegrityError(f"rewrite {key}: not done after {MAX_CALLS} calls")


def _check_same(key: str, before: dict[str, Any], after: object) -> None:
    """The rewritten generation must hold what the old one held."""
    if not isinstance(after, dict):
        raise IntegrityError(f"rewrite {key}: GCS reported no object for the rewrite")
    for field in ("size", "crc32c"):
        if str(after.get(field)) != str(before.get(field)):
            raise IntegrityError(
                f"rewrite {key}: the new generation's {field} {after.get(field)!r} is not "
                f"the old one's {before.get(field)!r}")
