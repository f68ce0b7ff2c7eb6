#!/usr/bin/env bash
# Loads images into the e2e cluster's containerd (namespace k8s.io), where the
# kubelet finds them; nothing can be pulled here. Usage:
#   load-images.sh IMAGE...     images from the local Docker daemon, via
#                               `docker save | ctr images import`
#                               (ckptdrain:dev becomes docker.io/library/ckptdrain:dev,
#                               which is what a pod's `image: ckptdrain:dev` means)
#   load-images.sh --oci FILE   an OCI archive (as e2e/images/pause/build.sh writes)
# Skips an image whose Docker image ID was already imported.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
running containerd || die "the cluster's containerd is not running (e2e/cluster/up.sh)"

stamps="$STATE/containerd/imported"
mkdir -p "$stamps"
while [ $# -gt 0 ]; do
  if [ "$1" = --oci ]; then
    [ $# -ge 2 ] || die "--oci needs a file"
    log "importing $2"
    actl images import "$2" >/dev/null
    shift 2
    continue
  fi
  image="$1"; shift
  id="$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null)" || die "no image $image in Docker (docker images)"
  # Docker's short names, spelled out the way containerd stores them.
  ref="$image"
  first="${image%%/*}"
  if [ "$first" = "$image" ]; then ref="docker.io/library/$image"
  elif [[ "$first" != *.* && "$first" != *:* && "$first" != localhost ]]; then ref="docker.io/$image"
  fi
  [[ "${ref##*/}" == *:* ]] || ref="$ref:latest"
  stamp="$stamps/$(printf '%s' "$ref" | tr '/:' '__')"
  if [ "$(cat "$stamp" 2>/dev/null)" = "$id" ] && actl images ls -q | grep -qxF "$ref"; then
    log "$ref already loaded"
    continue
  fi
  log "loading $image into containerd as $ref"
  t0=$SECONDS
  docker save "$image" | actl images import - >/dev/null
  echo "$id" >"$stamp"
  log "loaded $ref in $((SECONDS - t0))s"
done
