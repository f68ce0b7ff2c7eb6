#!/usr/bin/env bash
# Builds a one-binary image without a registry or a Docker daemon: a static
# Go binary (standard library only) in a one-layer OCI image, written as an
# OCI archive that `ctr images import` reads. Cached by content; prints the
# path of the archive.
#
#   build.sh [pause]   the pod sandbox image, localhost/ckptdrain/pause:1.0
#                      (what containerd's sandbox_image points at)
#   build.sh netcheck  the smoke test's TCP server/client,
#                      localhost/ckptdrain/netcheck:1.0
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${CKPTDRAIN_CACHE:-$HOME/.cache/ckptdrain}"
prog="${1:-pause}"
case "$prog" in
  pause) image="${PAUSE_IMAGE:-localhost/ckptdrain/pause:1.0}" ;;
  netcheck) image="localhost/ckptdrain/netcheck:1.0" ;;
  *) echo "build.sh: unknown image $prog (pause or netcheck)" >&2; exit 2 ;;
esac
out="$CACHE/images/$prog"
mkdir -p "$out"

src_sum="$(printf '%s\n' "$image" | cat - "$here/$prog.go" "$here/build.sh" | sha256sum | cut -c1-16)"
archive="$out/$prog-$src_sum.oci.tar"
if [ -s "$archive" ]; then echo "$archive"; exit 0; fi

work="$(mktemp -d "$out/build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/rootfs"
# A single file outside any module: no go.mod needed, nothing to download.
(cd "$here" && CGO_ENABLED=0 GOFLAGS= GO111MODULE=off go build -trimpath -ldflags "-s -w" -o "$work/rootfs/$prog" "$prog.go")

python3 - "$work" "$image" "$archive" "$prog" <<'PY'
import hashlib, io, json, os, sys, tarfile

work, name, archive, prog = sys.argv[1:5]

def reproducible(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info

layer = io.BytesIO()
with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
    t.add(os.path.join(work, "rootfs", prog), arcname=prog, filter=reproducible)
layer = layer.getvalue()
diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()

config = json.dumps({
    "architecture": "amd64",
    "os": "linux",
    "config": {"Entrypoint": ["/" + prog], "User": "65535:65535"},
    "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    "history": [{"created_by": "e2e/images/pause/build.sh"}],
}, sort_keys=True).encode()

def descriptor(media_type: str, blob: bytes) -> dict:
    return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(blob).hexdigest(), "size": len(blob)}

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
index = json.dumps({"schemaVersion": 2, "manifests": [manifest_desc]}, sort_keys=True).encode()

tmp = archive + ".tmp"
with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as t:
    def add(path: str, data: bytes) -> None:
        info = reproducible(tarfile.TarInfo(path))
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    add("index.json", index)
    for blob in (layer, config, manifest):
        add("blobs/sha256/" + hashlib.sha256(blob).hexdigest(), blob)
os.replace(tmp, archive)
PY
# Older builds of the same image are of no further use.
find "$out" -maxdepth 1 -name "$prog-*.oci.tar" ! -path "$archive" -delete
echo "$archive"
