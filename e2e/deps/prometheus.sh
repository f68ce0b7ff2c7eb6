#!/usr/bin/env bash
# Puts prometheus and promtool into $CACHE/prometheus/bin once and prints that
# directory. The tests check the chart's alert rules with promtool (check
# rules, test rules) and run their expressions against a real prometheus
# scraping a real agent (tests/chart/test_monitoring.py,
# tests/integration/test_alerts.py).
#
# Source: Debian's `prometheus` package (2.42 on bookworm), unpacked, not
# installed: only the two binaries are taken, so no service, user or web
# assets land on the host. A cold build of Prometheus v3 from the Go module
# proxy took 19 min on 2 cores; the package takes seconds. The rules use
# nothing newer than 2.x's PromQL and promtool's rule tests.
set -euo pipefail

CACHE="${CKPTDRAIN_CACHE:-$HOME/.cache/ckptdrain}"
BIN="$CACHE/prometheus/bin"
mkdir -p "$BIN"

if [ ! -x "$BIN/prometheus" ] || [ ! -x "$BIN/promtool" ] || [ ! -f "$BIN/.from-debian" ]; then
  command -v apt-get >/dev/null || {
    echo "prometheus.sh: apt-get not found; put prometheus and promtool (2.42 or newer) in $BIN" >&2
    exit 1; }
  if ! apt-cache policy prometheus 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    echo "prometheus.sh: apt-get update (the package lists do not name prometheus yet)" >&2
    apt-get update -qq >&2
  fi
  # Unpack into a temporary directory and move into place at the end, so an
  # interrupted run never leaves a half-written binary that looks cached.
  tmp="$(mktemp -d "$CACHE/prometheus/fetch.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download -qq prometheus >&2)
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/root"
  "$tmp/root/usr/bin/promtool" --version >/dev/null
  rm -f "$BIN"/.version-* "$BIN/.from-debian"
  mv "$tmp/root/usr/bin/prometheus" "$tmp/root/usr/bin/promtool" "$BIN/"
  basename "$tmp"/prometheus_*.deb > "$BIN/.from-debian"
fi
echo "$BIN"
