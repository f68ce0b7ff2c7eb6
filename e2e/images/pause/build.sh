#!/usr/bin/env bash
# Builds a one-binary image without a registry or a Docker daemon: a static
# Go binary (standard library only) in a one-layer OCI image, written as an
# OCI archive that `ctr images import` reads (written by e2e/images/oci.py).
# Cached by content; prints the path of the archive.
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

src_sum="$(printf '%s\n' "$image" | cat - "$here/$prog.go" "$here/build.sh" "$here/../oci.py" \
  | sha256sum | cut -c1-16)"
archive="$out/$prog-$src_sum.oci.tar"
if [ -s "$archive" ]; then echo "$archive"; exit 0; fi

work="$(mktemp -d "$out/build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/rootfs"
# A single file outside any module: no go.mod needed, nothing to download.
(cd "$here" && CGO_ENABLED=0 GOFLAGS= GO111MODULE=off go build -trimpath -ldflags "-s -w" -o "$work/rootfs/$prog" "$prog.go")

python3 "$here/../oci.py" --binary "$work/rootfs/$prog" --path "/$prog" --name "$image" \
  --out "$archive" --created-by e2e/images/pause/build.sh
# Older builds of the same image are of no further use.
find "$out" -maxdepth 1 -name "$prog-*.oci.tar" ! -path "$archive" -delete
echo "$archive"
