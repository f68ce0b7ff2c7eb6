#!/usr/bin/env bash
# The e2e cluster on kind (needs Docker and internet): creates the cluster
# from cluster.yaml, loads the project image(s) and prints
# `export KUBECONFIG=...`, like e2e/cluster/up.sh does for the local cluster.
# Usage: up.sh [IMAGE...]   (default: ckptdrain:dev, built if Docker lacks it)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
kind="$(kind_bin)"
mkdir -p "$STATE"

if "$kind" get clusters 2>/dev/null | grep -qxF "$KIND_CLUSTER"; then
  log "cluster $KIND_CLUSTER exists"
  "$kind" get kubeconfig --name "$KIND_CLUSTER" >"$KUBECONFIG_ADMIN"
else
  "$kind" create cluster --name "$KIND_CLUSTER" --config "$E2E_KIND_DIR/cluster.yaml" \
    --kubeconfig "$KUBECONFIG_ADMIN" --wait 180s >&2
fi

images=("$@")
[ ${#images[@]} -gt 0 ] || images=(ckptdrain:dev)
for image in "${images[@]}"; do
  if ! docker image inspect "$image" >/dev/null 2>&1; then
    [ "$image" = ckptdrain:dev ] || die "no image $image in Docker"
    log "building $image"
    "$E2E_REPO_ROOT/e2e/image/build.sh" >&2
  fi
  "$E2E_KIND_DIR/load-images.sh" "$image"
done
echo "export KUBECONFIG=$KUBECONFIG_ADMIN"
