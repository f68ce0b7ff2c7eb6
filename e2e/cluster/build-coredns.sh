#!/usr/bin/env bash
# Builds CoreDNS for the e2e cluster, once, into the cache, with only the
# plugins the cluster's DNS needs (bind, kubernetes, cache, health, ready,
# errors, log): the full build drags in every cloud SDK. Prints the binary's path.
# Like upstream's plugin.cfg mechanism, but as a throwaway module with its
# own main, so nothing has to be generated inside the CoreDNS source.
set -euo pipefail

COREDNS_VERSION="${COREDNS_VERSION:-v1.12.4}"
CACHE="${CKPTDRAIN_CACHE:-$HOME/.cache/ckptdrain}"
OUT="$CACHE/coredns/$COREDNS_VERSION"
bin="$OUT/coredns"
# Rebuilt when this script (and so the plugin list) changes.
stamp="$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)"
built() { [ -x "$bin" ] && [ "$(cat "$bin.stamp" 2>/dev/null)" = "$stamp" ]; }
if built; then echo "$bin"; exit 0; fi

mkdir -p "$OUT/module"
exec 9>"$OUT/.build.lock"
flock 9
if built; then echo "$bin"; exit 0; fi

cd "$OUT/module"
cat >go.mod <<MOD
module ckptdrain.local/coredns

go 1.24.0

require github.com/coredns/coredns $COREDNS_VERSION
MOD
cat >main.go <<'GO'
// A CoreDNS with the plugins a one-node test cluster needs, nothing else.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// The order in which plugins see a query (upstream's plugin.cfg order).
	dnsserver.Directives = []string{"bind", "ready", "health", "errors", "log", "cache", "kubernetes"}
}

func main() { coremain.Run() }
GO
echo "building coredns $COREDNS_VERSION (cached in $OUT)" >&2
GOFLAGS=-mod=mod go mod tidy >&2
CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$bin.tmp" .
mv "$bin.tmp" "$bin"
echo "$stamp" >"$bin.stamp"
echo "$bin"
