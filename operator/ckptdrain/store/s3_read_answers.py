"""S3's answers to GetObject, HeadObject and ListObjectsV2 read into the
dicts botocore's client returns (the fields S3Store and the gate read, by
botocore's names and types), and its error answers into what a ClientError
carries. Pure: bytes and headers in, dicts out.

    ResponseMetadata   HTTPStatusCode, HTTPHeaders (lower-case), RequestId, HostId
    GetObject/Head     ContentLength (int), ContentRange, ETag, LastModified
                       (datetime), ContentType, AcceptRanges, StorageClass
    ListObjectsV2      Contents [Key, Size (int), LastModified, ETag,
                       StorageClass], IsTruncated (bool), NextContinuationToken,
                       KeyCount; keys url-decoded when the answer says
                       EncodingType url (we always ask for it, as botocore
                       does: a key may hold characters XML cannot)
    errors             {"Error": {"Code", "Message", ...}, "ResponseMetadata"};
                       no body (HEAD) or none that parses: Code is the status
                       ("404"), Message its reason phrase, as botocore says
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import unquote_plus
from xml.etree import ElementTree

#: Object headers and the names botocore gives them.
_OBJECT_HEADERS = {
    "content-range": "ContentRange", "etag": "ETag", "content-type": "ContentType",
    "accept-ranges": "AcceptRanges", "x-amz-storage-class": "StorageClass",
}


def metadata(status: int, headers: Mapping[str, str]) -> dict[str, Any]:
    return {"HTTPStatusCode": status, "HTTPHeaders": dict(headers),
            "RequestId": headers.get("x-amz-request-id", ""),
            "HostId": headers.get("x-amz-id-2", ""), "RetryAttempts": 0}


def object_answer(status: int, headers: Mapping[str, str]) -> dict[str, Any]:
    """A GetObject or HeadObject answer's fields (the body apart)."""
    out: dict[str, Any] = {"ResponseMetadata": metadata(status, headers)}
    if "content-length" in headers:
        out["ContentLength"] = int(headers["content-length"])
    if "last-modified" in headers:
        # One that does not parse is left out: the store reads no date from
        # an object's answer, and a read must not fail over one.
        with contextlib.suppress(TypeError, ValueError):
            out["LastModified"] = parsedate_to_datetime(headers["last-modified"])
    for header, name in _OBJECT_HEADERS.items():
        if header in headers:
            out[name] = headers[header]
    return out


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _children(element: ElementTree.Element) -> dict[str, str]:
    return {_local(child.tag): child.text or "" for child in element}


def list_answer(status: int, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    """A ListObjectsV2 page. ValueError for a body that is not its XML."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as err:
        raise ValueError(f"a ListObjectsV2 answer that is not XML ({err})") from None
    if _local(root.tag) != "ListBucketResult":
        raise ValueError(f"a ListObjectsV2 answer of <{_local(root.tag)}>")
    top = _children(root)
    decode = unquote_plus if top.get("EncodingType") == "url" else str
    contents = []
    for element in root:
        if _local(element.tag) != "Contents":
            continue
        fields = _children(element)
        item: dict[str, Any] = {"Key": decode(fields.get("Key", "")),
                                "Size": int(fields.get("Size") or 0)}
        if fields.get("LastModified"):
            item["LastModified"] = datetime.fromisoformat(fields["LastModified"])
        for name in ("ETag", "StorageClass"):
            if name in fields:
                item[name] = fields[name]
        contents.append(item)
    out: dict[str, Any] = {"ResponseMetadata": metadata(status, headers),
                           "IsTruncated": top.get("IsTruncated", "").lower() == "true"}
    if contents:
        out["Contents"] = contents
    for name in ("NextContinuationToken", "ContinuationToken", "EncodingType"):
        if name in top:
            out[name] = top[name]
    if "Prefix" in top:
        out["Prefix"] = decode(top["Prefix"])
    if top.get("KeyCount", "").isdigit():
        out["KeyCount"] = int(top["KeyCount"])
    return out


def error_answer(status: int, reason: str, headers: Mapping[str, str],
                 body: bytes) -> dict[str, Any]:
    """What botocore's ClientError carries for an error answer."""
    error: dict[str, str] = {}
    if body.strip():
        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError:
            root = None
        if root is not None and _local(root.tag) == "Error":
            error = _children(root)
    if not error.get("Code"):
        error = {**error, "Code": str(status), "Message": error.get("Message") or reason}
    error.setdefault("Message", "")
    return {"Error": error, "ResponseMetadata": metadata(status, headers)}
