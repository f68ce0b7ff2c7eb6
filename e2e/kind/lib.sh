# Shared by e2e/kind/*.sh. Sourced, not run.
CACHE="${CKPTDRAIN_CACHE:-$HOME/.cache/ckptdrain}"
KIND_VERSION="${KIND_VERSION:-v0.29.0}"
KIND_CLUSTER="${KIND_CLUSTER:-ckptdrain-e2e}"
STATE="${CKPTDRAIN_KIND_STATE:-$CACHE/kind}"
KUBECONFIG_ADMIN="$STATE/kubeconfig"
E2E_KIND_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
E2E_REPO_ROOT="$(cd "$E2E_KIND_DIR/../.." && pwd)"

log() { printf '%s [kind] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# kind_bin: a kind on PATH, else one built once from the Go module proxy.
kind_bin() {
  if command -v kind >/dev/null; then command -v kind; return; fi
  local bin="$CACHE/kind/$KIND_VERSION/kind"
  if [ ! -x "$bin" ]; then
    log "building kind $KIND_VERSION into $(dirname "$bin")"
    GOBIN="$(dirname "$bin")" go install "sigs.k8s.io/kind@$KIND_VERSION" >&2
  fi
  echo "$bin"
}
