#!/usr/bin/env bash
# Builds the MinIO server once from the Go module proxy into a cache outside
# the repository and prints the binary's path. Usage: minio.sh
# The integration tests (tests/support/s3servers.py) start it on 127.0.0.1.
#
# The version is pinned: MinIO tags releases as RELEASE.<date>, not semver,
# so the proxy serves the default branch as pseudo-versions, and @latest
# would hand each new cache whatever that branch was on the day (the
# hostile-tenant suite measures MinIO's answers to per-tenant policies,
# which must not move under it). The pin is the one the test caches were
# built from (2026-11-21), which builds with Go 1.26. MINIO_VERSION
# overrides it. A cached binary built from another version is rebuilt
# (`go version -m` names the module version a binary was built from). A cold
# build takes ~10 minutes on 2 cores; later runs return at once.
set -euo pipefail

MINIO_VERSION="${MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"
CACHE="${CKPTDRAIN_CACHE:-$HOME/.cache/ckptdrain}"
BIN="$CACHE/minio/bin"
mkdir -p "$BIN"

# The module version the cached binary was built from ("" when none is there).
# Without Go nothing could be rebuilt: a cached binary is taken as it is.
built_version() {
  [ -x "$BIN/minio" ] || return 0
  if ! command -v go >/dev/null; then
    echo "minio.sh: no go to check $BIN/minio against $MINIO_VERSION; using it" >&2
    echo "$MINIO_VERSION"
    return 0
  fi
  go version -m "$BIN/minio" | awk '$1 == "mod" && $2 == "github.com/minio/minio" { print $3 }'
}

if [ "$(built_version)" != "$MINIO_VERSION" ]; then
  # Build into a temporary GOBIN and move it in place at the end, so an
  # interrupted build never leaves a half-written binary that looks cached.
  tmp="$(mktemp -d "$CACHE/minio/build.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  # CGO off: a static binary that does not depend on the host's libc.
  CGO_ENABLED=0 GOBIN="$tmp" go install "github.com/minio/minio@$MINIO_VERSION" >&2
  mv "$tmp/minio" "$BIN/minio"
fi
echo "$BIN/minio"
