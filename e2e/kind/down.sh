#!/usr/bin/env bash
# Deletes the kind e2e cluster (its node container, network and kubeconfig).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
kind="$(kind_bin)"
"$kind" delete cluster --name "$KIND_CLUSTER" >&2
rm -f "$KUBECONFIG_ADMIN"
log "kind cluster $KIND_CLUSTER deleted"
