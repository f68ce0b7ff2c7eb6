"""The gs:// store's multipart uploads: parts stored as objects, composed on
the server.

GCS has no S3-style multipart upload in its JSON API, but it composes up to
32 objects into one without moving their bytes through the client. So an
upload is objects under the store's reserved area, which no key can name
(paths.py refuses a `.ckptdrain-` component) and listings hide:

    <prefix>/.ckptdrain-uploads/key/<id>/<key>      marks the upload (empty)
    <prefix>/.ckptdrain-uploads/part/<id>/<00001>   each part, its etag the
                                                    object's generation
    <prefix>/.ckptdrain-uploads/part/<id>/c<..>     intermediate composes

Markers have a prefix of their own, so listing the unfinished uploads (each
orphan sweep does) reads one small object per upload, not every part.

Like S3's, an upload survives the process that started it: a resumed drain
lists its parts and completes it. Completion composes the parts named, each
pinned to the generation the caller was told (a part sent again meanwhile
is not taken in its place), 32 at a time into intermediate objects when
there are more, then checks that GCS's CRC32C of the result is the
combination of the parts' before the parts go.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import quote

from ckptdrain import checksum
from ckptdrain.errors import IntegrityError, InvalidInput, ObjectMissing
from ckptdrain.paths import RESERVED_PREFIX, check_key
from ckptdrain.store.base import MultipartUpload, UploadedPart
from ckptdrain.store.gcs_formats import when
from ckptdrain.store.s3_bodies import PacedBody, WindowBody

if TYPE_CHECKING:
    from collections.abc import Callable

    import urllib3

UPLOADS = RESERVED_PREFIX + "uploads"
_ID = re.compile(r"[0-9a-f]{32}")
MAX_PART_NUMBER = 10_000  # as on S3
COMPOSE_MAX = 32  # sources GCS composes in one request
MAX_NAME_BYTES = 1024


class GcsMultipart:
    """GcsStore's multipart operations (the Store protocol's upload half)."""

    bucket: str
    prefix: str
    _base: str
    _pace: Callable[[int], object] | None

    if TYPE_CHECKING:  # GcsStore's own helpers
        @property
        def min_part_size(self) -> int: ...
        def _name(self, key: str) -> str: ...
        def _where(self, key: str | None) -> str: ...
        def _request(self, op: str, method: str, url: str, key: str | None, *,
                     body: Any = None, size: int = 0, headers: Any = None,
                     stream: bool = False, missing: bool = False
                     ) -> urllib3.BaseHTTPResponse | None: ...
        def _json(self, response: urllib3.BaseHTTPResponse, op: str, key: str | None
                  ) -> dict[str, Any]: ...
        def _upload(self, op: str, name: str, key: str, body: Any, size: int,
                    crc: int) -> dict[str, Any]: ...
        def _delete_name(self, name: str, key: str | None,
                         generation: str | None = None) -> None: ...
        def _stat(self, name: str, key: str | None) -> dict[str, Any] | None: ...
        def _list_names(self, full_prefix: str) -> Iterator[dict[str, Any]]: ...

    def _area(self) -> str:
        return f"{self.prefix}/{UPLOADS}/" if self.prefix else f"{UPLOADS}/"

    def _marker(self, key: str, upload_id: str) -> str:
        return f"{self._area()}key/{upload_id}/{key}"

    def _parts_of(self, upload_id: str) -> str:
        return f"{self._area()}part/{upload_id}/"

    def _part(self, upload_id: str, number: int) -> str:
        return f"{self._parts_of(upload_id)}{number:05d}"

    def _live(self, key: str, upload_id: str) -> bool:
        """Whether `upload_id` (from a journal or a caller) is a live upload of `key`."""
        check_key(key)
        if not isinstance(upload_id, str) or not _ID.fullmatch(upload_id):
            return False
        return self._stat(self._marker(key, upload_id), key) is not None

    def create_multipart(self, key: str) -> str:
        check_key(key)
        upload_id = uuid.uuid4().hex
        marker = self._marker(key, upload_id)
        if len(marker.encode()) > MAX_NAME_BYTES:
            raise InvalidInput("key", f"a key short enough for a GCS upload marker "
                               f"(at most {MAX_NAME_BYTES} bytes with the prefix)", key)
        self._upload("upload", marker, key, PacedBody(b"", None), 0, checksum.crc32c(b""))
        return upload_id

    def _store_part(self, key: str, upload_id: str, number: int, body: Any, size: int,
                    crc: int) -> UploadedPart:
        if not 1 <= number <= MAX_PART_NUMBER:
            raise InvalidInput("part number", f"1..{MAX_PART_NUMBER}", number)
        if not self._live(key, upload_id):
            raise ObjectMissing(key)
        meta = self._upload(f"upload part {number} of", self._part(upload_id, number), key,
                            body, size, crc)
        return UploadedPart(number=number, etag=str(meta.get("generation", "")), crc32c=crc)

    def upload_part(
        self, key: str, upload_id: str, number: int, data: bytes, crc32c: int | None = None
    ) -> UploadedPart:
        if crc32c is None:
            crc32c = checksum.crc32c(memoryview(data).cast("B"))
        return self._store_part(key, upload_id, number, PacedBody(data, self._pace), len(data),
                                crc32c)

    def upload_part_from(self, key: str, upload_id: str, number: int, stream: BinaryIO,
                         size: int, crc32c: int) -> UploadedPart:
        return self._store_part(key, upload_id, number,
                                WindowBody(stream, size, self._pace, strict=True), size, crc32c)

    def _held(self, upload_id: str) -> dict[int, dict[str, Any]]:
        found: dict[int, dict[str, Any]] = {}
        for item in self._list_names(self._parts_of(upload_id)):
            tail = str(item["name"]).rsplit("/", 1)[-1]
            if tail.isdigit() and len(tail) == 5:
                found[int(tail)] = item
        return found

    def list_parts(self, key: str, upload_id: str) -> list[UploadedPart] | None:
        if not self._live(key, upload_id):
            return None
        return [UploadedPart(n, str(item.get("generation", "")),
                             crc32c=checksum.from_b64(item.get("crc32c")),
                             modified=when(item.get("updated")))
                for n, item in sorted(self._held(upload_id).items())]

    def _compose(self, target: str, key: str, sources: list[tuple[str, str]]) -> dict[str, Any]:
        url = (f"{self._base}/storage/v1/b/{quote(self.bucket, safe='')}/o/"
               f"{quote(target, safe='')}/compose")
        body = {"destination": {"contentType": "application/octet-stream"},
                "sourceObjects": [{"name": name, "generation": generation}
                                  for name, generation in sources]}
        data = json.dumps(body).encode()
        response = self._request("compose", "POST", url, key, body=data, size=len(data),
                                 headers={"Content-Type": "application/json"})
        assert response is not None
        return self._json(response, "compose", key)

    def complete_multipart(self, key: str, upload_id: str, parts: list[UploadedPart]) -> None:
        """Compose `parts` in order into the object. ObjectMissing if the upload
        is gone; IntegrityError if a part is missing or was sent again (its
        generation differs), the list is empty or out of order, or a part but
        the last is under min_part_size."""
        if not self._live(key, upload_id):
            raise ObjectMissing(key)
        if not parts:
            raise IntegrityError(f"multipart upload for {key}: no parts to complete")
        numbers = [p.number for p in parts]
        if numbers != sorted(set(numbers)):
            raise IntegrityError(f"multipart upload for {key}: parts not in ascending order")
        held = self._held(upload_id)
        crc, size = 0, 0
        for i, part in enumerate(parts):
            item = held.get(part.number)
            if item is None or str(item.get("generation")) != part.etag:
                raise IntegrityError(
                    f"multipart upload for {key}: part {part.number} missing or its etag differs")
            length = int(item.get("size", 0))
            if i < len(parts) - 1 and length < self.min_part_size:
                raise IntegrityError(f"multipart upload for {key}: part {part.number} is "
                                     f"smaller than min_part_size {self.min_part_size}")
            part_crc = checksum.from_b64(item.get("crc32c"))
            if part_crc is None or (part.crc32c is not None and part.crc32c != part_crc):
                raise IntegrityError(f"multipart upload for {key}: part {part.number}'s "
                                     "CRC32C is not the one it was sent with")
            crc, size = checksum.combine(crc, part_crc, length), size + length
        sources = [(self._part(upload_id, p.number), p.etag) for p in parts]
        level = 0
        while len(sources) > COMPOSE_MAX:
            # Intermediate objects in the upload's area: aborted with it.
            merged = []
            for i in range(0, len(sources), COMPOSE_MAX):
                name = f"{self._parts_of(upload_id)}c{level:02d}-{i // COMPOSE_MAX:05d}"
                meta = self._compose(name, key, sources[i:i + COMPOSE_MAX])
                merged.append((name, str(meta.get("generation", ""))))
            sources, level = merged, level + 1
        meta = self._compose(self._name(key), key, sources)
        if int(meta.get("size", -1)) != size or checksum.from_b64(meta.get("crc32c")) != crc:
            # That generation only: never a newer object another completion made.
            self._delete_name(self._name(key), key, generation=str(meta.get("generation", "")))
            raise IntegrityError(f"multipart upload for {key}: the composed object is not "
                                 "its parts (size or CRC32C differs); deleted")
        self._discard(key, upload_id)

    def _discard(self, key: str, upload_id: str) -> None:
        """Delete an upload's parts and intermediates, then its marker."""
        for item in list(self._list_names(self._parts_of(upload_id))):
            self._delete_name(str(item["name"]), key)
        self._delete_name(self._marker(key, upload_id), key)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        if self._live(key, upload_id):
            self._discard(key, upload_id)

    def list_multipart_uploads(self, prefix: str) -> list[MultipartUpload]:
        markers = f"{self._area()}key/"
        found = []
        for item in self._list_names(markers):
            upload_id, sep, key = str(item["name"])[len(markers):].partition("/")
            if sep and _ID.fullmatch(upload_id) and key.startswith(prefix):
                found.append(MultipartUpload(key, upload_id, when(item.get("updated"))))
        found.sort(key=lambda u: (u.key.encode("utf-8"), u.upload_id))
        return found
