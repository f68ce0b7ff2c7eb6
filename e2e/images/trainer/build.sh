#!/usr/bin/env bash
# Builds the e2e trainer image (ckptdrain-trainer:dev) on top of the project
# image, offline. Prints the image name.
# Env: IMAGE (default ckptdrain-trainer:dev), BASE_IMAGE (default ckptdrain:dev),
#      TORCH_INDEX (optional: a PyTorch CPU wheel index to bake torch in)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
IMAGE="${IMAGE:-ckptdrain-trainer:dev}"
BASE_IMAGE="${BASE_IMAGE:-ckptdrain:dev}"
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "$here/Dockerfile" "$here/train.py" "$here/train_dcp.py" "$ctx/"
. "$here/../../image/build-replacing.sh"
build_replacing "$IMAGE" --build-arg BASE_IMAGE="$BASE_IMAGE" \
  --build-arg TORCH_INDEX="${TORCH_INDEX:-}" "$ctx"
echo "$IMAGE"
