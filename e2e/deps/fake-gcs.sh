#!/usr/bin/env bash
# Builds fake-gcs-server, a GCS JSON API server, once from the Go module
# proxy into a cache outside the repository and prints the binary's path.
# The integration tests (tests/support/gcsserver.py) start it on 127.0.0.1
# and run the store contract against it as against the S3 servers.
#
# FAKE_GCS_VERSION overrides the module version. A cold build takes about a
# minute on 2 cores; later runs return at once.
set -euo pipefail

FAKE_GCS_VERSION="${FAKE_GCS_VERSION:-v1.52.2}"
CACHE="${CKPTDRAIN_CACHE:-$HOME/.cache/ckptdrain}"
BIN="$CACHE/fake-gcs/$FAKE_GCS_VERSION/bin"
mkdir -p "$BIN"

if [ ! -x "$BIN/fake-gcs-server" ]; then
  # A temporary GOBIN moved in place at the end: an interrupted build never
  # leaves a half-written binary that looks cached.
  tmp="$(mktemp -d "$CACHE/fake-gcs/build.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  CGO_ENABLED=0 GOBIN="$tmp" go install "github.com/fsouza/fake-gcs-server@$FAKE_GCS_VERSION" >&2
  mv "$tmp/fake-gcs-server" "$BIN/fake-gcs-server"
fi
echo "$BIN/fake-gcs-server"
