#!/usr/bin/env bash
# Builds the quickstart's MinIO image offline (see the Dockerfile beside this)
# under the image name docs/examples/quickstart/s3.yaml uses. Prints that name.
# Env: BASE_IMAGE (default ckptdrain:dev), CKPTDRAIN_CACHE
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
BASE_IMAGE="${BASE_IMAGE:-ckptdrain:dev}"
# One source for the name: the manifest the quickstart applies.
IMAGE=$(sed -n 's|^ *image: *\(.*minio/minio:[^ ]*\) *$|\1|p' "$repo/docs/examples/quickstart/s3.yaml")
[ -n "$IMAGE" ] || { echo "minio/build.sh: no minio image in docs/examples/quickstart/s3.yaml" >&2; exit 1; }
binary=$("$repo/e2e/deps/minio.sh")
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "$here/Dockerfile" "$ctx/"
cp "$binary" "$ctx/minio"
. "$repo/e2e/image/build-replacing.sh"
build_replacing "$IMAGE" --build-arg BASE_IMAGE="$BASE_IMAGE" "$ctx"
echo "$IMAGE"
