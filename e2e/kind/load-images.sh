#!/usr/bin/env bash
# Loads images from the local Docker daemon into the kind node, where the
# kubelet finds them (the counterpart of e2e/cluster/load-images.sh).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
kind="$(kind_bin)"
for image in "$@"; do
  log "loading $image"
  "$kind" load docker-image "$image" --name "$KIND_CLUSTER" >&2
done
