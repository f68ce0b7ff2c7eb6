"""Moving an object of the s3:// store to another storage class, in place.

S3 changes an object's class only by copying it onto itself with the new
class: one CopyObject up to 5 GiB, a multipart copy (UploadPartCopy of
ranges, all on the server) beyond. Until the copy completes the old object
stays whole, and both hold the same bytes, so a restore reading while it
runs reads the same data either way. Encryption is asked for again on the
copy (a copy does not inherit it). A store that cannot do it (an unknown
class, or SeaweedFS, which refuses any copy onto itself) raises StoreError
and the object stays as it was.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, NoReturn

from ckptdrain.errors import ObjectMissing
from ckptdrain.store.s3_errors import MISSING_KEY_CODES

#: Largest object one CopyObject may copy (S3's limit).
SINGLE_COPY_LIMIT = 5 << 30
#: Ranges of a multipart copy (S3 allows 5 MiB to 5 GiB, 10,000 parts).
COPY_PART_SIZE = 1 << 30


class S3StorageClass:
    """S3Store's storage-class change (not part of the Store protocol)."""

    bucket: str
    _create_args: dict[str, Any]

    if TYPE_CHECKING:  # S3Store's own helpers
        def _key(self, key: str) -> str: ...
        def _fail(self, err: Exception, op: str, key: str | None = None) -> NoReturn: ...
        def _call(self, op: str, key: str | None, *, handled: Collection[str] = (),
                  **kwargs: Any) -> Any: ...

    def change_storage_class(self, key: str, size: int, storage_class: str, *,
                             stopping: Callable[[], bool] = lambda: False,
                             single_copy_limit: int = SINGLE_COPY_LIMIT,
                             part_size: int = COPY_PART_SIZE) -> bool:
        """Copy `key` (`size` bytes, as listed) onto itself in `storage_class`;
        False when `stopping()` ended a multipart copy first (it is aborted:
        the object stays as it was)."""
        source = {"Bucket": self.bucket, "Key": self._key(key)}
        args = {"Key": self._key(key), "StorageClass": storage_class, **self._create_args}
        if size <= single_copy_limit:
            response = self._call("copy_object", key, handled=MISSING_KEY_CODES,
                                  CopySource=source, MetadataDirective="COPY", **args)
            if not isinstance(response, dict):
                raise ObjectMissing(f"{key}: gone before its storage class could change")
            return True
        upload = self._call("create_multipart_upload", key, **args)["UploadId"]
        try:
            parts = []
            for number, start in enumerate(range(0, size, part_size), start=1):
                if stopping():  # the object stays whole; an abort that fails is swept later
                    with contextlib.suppress(Exception):
                        self._call("abort_multipart_upload", key, Key=self._key(key),
                                   UploadId=upload)
                    return False
                end = min(size, start + part_size) - 1
                answer = self._call("upload_part_copy", key, CopySource=source,
                                    CopySourceRange=f"bytes={start}-{end}",
                                    Key=self._key(key), UploadId=upload, PartNumber=number)
                parts.append({"PartNumber": number, "ETag": answer["CopyPartResult"]["ETag"]})
            self._call("complete_multipart_upload", key, Key=self._key(key), UploadId=upload,
                       MultipartUpload={"Parts": parts})
            return True
        except BaseException:
            with contextlib.suppress(Exception):  # the error that stopped it is what matters
                self._call("abort_multipart_upload", key, Key=self._key(key), UploadId=upload)
            raise
