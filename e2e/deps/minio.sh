#!/usr/bin/env bash
# Builds the MinIO server once from the Go module proxy into a cache outside
# the repository and prints the binary's path. Usage: minio.sh
# The integration tests (tests/support/s3servers.py) start it on 127.0.0.1.
#
# MINIO_VERSION overrides the module version (default: latest). MinIO tags
# releases as RELEASE.<date>, not semver, so the proxy resolves @latest to a
# pseudo-version of the default branch; on 2026-11-21 that was
# v0.0.0-20260212201848-7aac2a2c5b7c, which builds with Go 1.26 (no pin
# needed). A cold build takes ~10 minutes on 2 cores; later runs return at once.
set -euo pipefail

MINIO_VERSION="${MINIO_VERSION:-latest}"
CACHE="${CKPTDRAIN_CACHE:-$HOME/.cache/ckptdrain}"
BIN="$CACHE/minio/bin"
mkdir -p "$BIN"

if [ ! -x "$BIN/minio" ]; then
  # Build into a temporary GOBIN and move it in place at the end, so an
  # interrupted build never leaves a half-written binary that looks cached.
  tmp="$(mktemp -d "$CACHE/minio/build.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  # CGO off: a static binary that does not depend on the host's libc.
  CGO_ENABLED=0 GOBIN="$tmp" go install "github.com/minio/minio@$MINIO_VERSION" >&2
  mv "$tmp/minio" "$BIN/minio"
fi
echo "$BIN/minio"
