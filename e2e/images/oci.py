"""Writes a one-layer OCI image archive from a static binary, without a
registry or a Docker daemon; `ctr images import` reads it.

    oci.py --binary FILE --path /NAME --name REF --out ARCHIVE [--user UID:GID]
           [--created-by TEXT]

The layer holds the one binary at PATH (also the entrypoint) and nothing
else. Everything is written reproducibly (no owners, mtime 0, sorted JSON),
so the same binary always gives the same image digest and a rebuild of an
unchanged image is never imported again.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import tarfile


def reproducible(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def descriptor(media_type: str, blob: bytes) -> dict[str, object]:
    return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(blob).hexdigest(),
            "size": len(blob)}


def write(binary: str, path: str, name: str, out: str, user: str, created_by: str) -> None:
    layer_io = io.BytesIO()
    with tarfile.open(fileobj=layer_io, mode="w", format=tarfile.PAX_FORMAT) as t:
        t.add(binary, arcname=path.lstrip("/"), filter=reproducible)
    layer = layer_io.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": [path], "User": user},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": created_by}],
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", config),
        "layers": [descriptor("application/vnd.oci.image.layer.v1.tar", layer)],
    }, sort_keys=True).encode()
    manifest_desc = descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
    manifest_desc["platform"] = {"architecture": "amd64", "os": "linux"}
    manifest_desc["annotations"] = {
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
    }
    index = json.dumps({"schemaVersion": 2, "manifests": [manifest_desc]},
                       sort_keys=True).encode()

    # Written aside and renamed: an interrupted run never leaves an archive
    # that looks complete.
    tmp = out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as t:
        def add(member: str, data: bytes) -> None:
            info = reproducible(tarfile.TarInfo(member))
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", index)
        for blob in (layer, config, manifest):
            add("blobs/sha256/" + hashlib.sha256(blob).hexdigest(), blob)
    os.replace(tmp, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--path", required=True, help="where the binary lives in the image")
    parser.add_argument("--name", required=True, help="image reference, NAME:TAG")
    parser.add_argument("--out", required=True)
    parser.add_argument("--user", default="65535:65535")
    parser.add_argument("--created-by", default="e2e/images/oci.py")
    args = parser.parse_args()
    if ":" not in args.name.rsplit("/", 1)[-1]:
        parser.error(f"--name: expected NAME:TAG, got {args.name!r}")
    write(args.binary, args.path, args.name, args.out, args.user, args.created_by)


if __name__ == "__main__":
    main()
