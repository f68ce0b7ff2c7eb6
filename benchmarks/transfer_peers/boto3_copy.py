"""boto3's managed transfers, file after file, as most scripts use them:

    boto3_copy.py up <src dir> <bucket> <prefix>
    boto3_copy.py down <bucket> <prefix> <dest dir>

Endpoint and credentials from the environment (EP, AWS_*). boto3's CRT
transfer mode is not a peer here: it builds its request serializer with no
endpoint (boto3/crt.py), so it reaches AWS only, never a server on
loopback; awscrt_copy.py runs the client it wraps directly."""

from __future__ import annotations

import os
import sys

import boto3


def main(argv: list[str]) -> int:
    s3 = boto3.client("s3", endpoint_url=os.environ["EP"])
    if argv[0] == "up":
        src, bucket, prefix = argv[1:4]
        for d, _, files in os.walk(src):
            for f in files:
                path = os.path.join(d, f)
                s3.upload_file(path, bucket, prefix + os.path.relpath(path, src))
        return 0
    bucket, prefix, dest = argv[1:4]
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            path = os.path.join(dest, item["Key"][len(prefix):])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            s3.download_file(bucket, item["Key"], path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
