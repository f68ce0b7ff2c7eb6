#!/usr/bin/env bash
# Sourced by the image build scripts: `build_replacing IMAGE DOCKER_BUILD_ARG...`
# runs `docker build -q ... -t IMAGE`, then removes the project's images that
# no tag names any more. Docker keeps a replaced image, untagged, forever;
# every e2e run rebuilds the project's images, so each run left hundreds of
# MB behind until the disk filled and the kubelets reported DiskPressure.
# Only images carrying the project's label (the ckptdrain image and those
# built FROM it) are pruned, and only untagged ones no container uses.
build_replacing() {
  local image=$1; shift
  docker build -q "$@" -t "$image" >/dev/null
  docker image prune -f --filter "label=org.opencontainers.image.title=ckptdrain" >/dev/null \
    || echo "build-replacing.sh: could not prune the replaced images (left on disk)" >&2
}
