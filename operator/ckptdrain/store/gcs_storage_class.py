"""Moving an object of the gs:// store to another storage class, in place.

GCS changes an object's class by rewriting it onto itself with the new
class: the copy happens on the server, in as many calls as it needs (each
copies at most REWRITE_CHUNK and answers with a token to go on, until
`done`). Between calls the agent's `stopping()` is asked: a rewrite given up
changes nothing (GCS writes the new generation only when it is done), so a
SIGTERM flush never waits behind a large object for more than one call.

The rewrite is pinned twice to the generation that was read: the source is
that generation, and the destination is written only if it is still the
live one, so a newer write of the same name is never replaced by older
bytes. A rewrite body replaces the object's editable metadata, so it repeats
what the object had (content type, custom metadata, ...) beside the new
class. The new generation must report the same size and CRC32C as the one
it replaces; if it does not, the move fails loudly (restore verifies every
byte against the manifest in any case). A retried call that finds the old
generation gone (404, 412) looks again: if the live object is the same
bytes in the new class, the earlier call did the move.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ckptdrain.errors import GenerationChanged, IntegrityError, ObjectMissing, StoreError

if TYPE_CHECKING:
    import urllib3

#: Bytes GCS copies per call before it answers with a token: bounds each
#: request's time, so the agent's stop is never kept waiting on one.
REWRITE_CHUNK = 1 << 30
#: Calls one object's rewrite may take (GCS copies ~GB per call).
MAX_CALLS = 10_000
#: The editable metadata a rewrite body would otherwise reset.
_KEPT = ("contentType", "contentEncoding", "contentDisposition", "contentLanguage",
         "cacheControl", "metadata")


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

    def change_storage_class(self, key: str, size: int, storage_class: str, *,
                             stopping: Callable[[], bool] = lambda: False) -> bool:
        """Rewrite `key` (`size` bytes, as listed) onto itself in
        `storage_class`; False when `stopping()` ended it first (nothing changed)."""
        name = self._name(key)
        before = self._stat(name, key)
        if before is None:
            raise ObjectMissing(f"{key}: gone before its storage class could change")
        generation = str(before.get("generation") or "")
        if not generation.isdigit():
            raise StoreError(f"rewrite {key}: GCS reported no generation for the object")
        path = f"{quote(self.bucket, safe='')}/o/{quote(name, safe='')}"
        url = (f"{self._base}/storage/v1/b/{path}/rewriteTo/b/{path}"
               f"?sourceGeneration={generation}&ifGenerationMatch={generation}"
               f"&maxBytesRewrittenPerCall={REWRITE_CHUNK}")
        resource = {k: before[k] for k in _KEPT if k in before}
        body = json.dumps({**resource, "storageClass": storage_class}).encode()
        token = ""
        for _ in range(MAX_CALLS):
            if stopping():
                return False
            call = url + (f"&rewriteToken={quote(token, safe='')}" if token else "")
            try:
                response = self._request("rewrite", "POST", call, key, body=body,
                                         size=len(body),
                                         headers={"Content-Type": "application/json"},
                                         missing=True)
            except GenerationChanged:
                response = None
            if response is None:  # the pinned generation is gone: done by us, or changed
                self._check_done_earlier(key, name, before, storage_class)
                return True
            answer = self._json(response, "rewrite", key)
            if answer.get("done"):
                _check_same(key, before, answer.get("resource"))
                return True
            token = str(answer.get("rewriteToken") or "")
            if not token:
                raise IntegrityError(f"rewrite {key}: GCS answered neither done nor a token "
                                     "to go on")
        raise IntegrityError(f"rewrite {key}: not done after {MAX_CALLS} calls")

    def _check_done_earlier(self, key: str, name: str, before: dict[str, Any],
                            storage_class: str) -> None:
        """The generation the rewrite was pinned to is gone: fine only if the
        live object is the same bytes in the new class (a retried call whose
        first try finished the move)."""
        now = self._stat(name, key)
        if now is None:
            raise ObjectMissing(f"{key}: gone before its storage class could change")
        same = all(str(now.get(f)) == str(before.get(f)) for f in ("size", "crc32c"))
        if not same or now.get("storageClass") != storage_class:
            raise GenerationChanged(f"rewrite {key}: the object was written again while its "
                                    "storage class was changing; left as it is")


def _check_same(key: str, before: dict[str, Any], after: object) -> None:
    """The rewritten generation must hold what the old one held."""
    if not isinstance(after, dict):
        raise IntegrityError(f"rewrite {key}: GCS reported no object for the rewrite")
    for field in ("size", "crc32c"):
        if str(after.get(field)) != str(before.get(field)):
            raise IntegrityError(
                f"rewrite {key}: the new generation's {field} {after.get(field)!r} is not "
                f"the old one's {before.get(field)!r}")
