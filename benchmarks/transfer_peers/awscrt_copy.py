"""awscrt's native S3 client used directly (the engine under Mountpoint for
S3 and boto3's CRT mode), every file in flight at once:

    awscrt_copy.py up <src dir> <bucket> <prefix>
    awscrt_copy.py down <bucket> <prefix> <dest dir>

It splits each object into parts itself (8 MiB, its default) and sizes its
connections for `GBPS` Gb/s: 2 here, not its default of 10, which on two
cores opened so many connections that downloads fell to a third of the
speed and then failed ("failure to meet throughput minimum"). Path-style requests to the
endpoint in EP, signed with AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY; the
listing for a download is one boto3 call."""

from __future__ import annotations

import os
import sys
import urllib.parse

import boto3
from awscrt.auth import AwsCredentialsProvider
from awscrt.http import HttpHeaders, HttpRequest
from awscrt.io import ClientBootstrap, DefaultHostResolver, EventLoopGroup
from awscrt.s3 import (
    S3Client,
    S3RequestTlsMode,
    S3RequestType,
    create_default_s3_signing_config,
)


def main(argv: list[str]) -> int:
    endpoint = urllib.parse.urlsplit(os.environ["EP"])
    region = os.environ.get("AWS_REGION", "us-east-1")
    credentials = AwsCredentialsProvider.new_static(os.environ["AWS_ACCESS_KEY_ID"],
                                                    os.environ["AWS_SECRET_ACCESS_KEY"])
    loop = EventLoopGroup()
    client = S3Client(
        bootstrap=ClientBootstrap(loop, DefaultHostResolver(loop)), region=region,
        signing_config=create_default_s3_signing_config(region=region,
                                                        credential_provider=credentials),
        tls_mode=S3RequestTlsMode.DISABLED if endpoint.scheme == "http"
        else S3RequestTlsMode.ENABLED,
        throughput_target_gbps=float(os.environ.get("GBPS", "2")))

    def request(method: str, bucket: str, key: str, size: int | None = None) -> HttpRequest:
        headers = HttpHeaders([("Host", endpoint.netloc)])
        if size is not None:
            headers.add("Content-Length", str(size))
        return HttpRequest(method, f"/{bucket}/{urllib.parse.quote(key)}", headers)

    pending = []
    if argv[0] == "up":
        src, bucket, prefix = argv[1:4]
        for d, _, files in os.walk(src):
            for f in files:
                path = os.path.join(d, f)
                key = prefix + os.path.relpath(path, src)
                pending.append(client.make_request(
                    type=S3RequestType.PUT_OBJECT, send_filepath=path,
                    request=request("PUT", bucket, key, os.path.getsize(path))).finished_future)
    else:
        bucket, prefix, dest = argv[1:4]
        s3 = boto3.client("s3", endpoint_url=os.environ["EP"])
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                path = os.path.join(dest, item["Key"][len(prefix):])
                os.makedirs(os.path.dirname(path), exist_ok=True)
                pending.append(client.make_request(
                    type=S3RequestType.GET_OBJECT, recv_filepath=path,
                    request=request("GET", bucket, item["Key"])).finished_future)
    for future in pending:
        future.result()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
