#!/usr/bin/env bash
# Installs etcd for the cluster tests and prints the path of the etcd binary.
#
# Debian's etcd-server (3.4.23 on bookworm) is enough for kube-apiserver 1.33
# on 127.0.0.1: the apiserver speaks etcd's v3 API, which 3.4 serves (checked
# by tests/cluster, which start both). If an etcd binary is already cached
# (for example one built from the Go module proxy), that one wins.
#
# The package's maintainer scripts may try to start a system etcd on the
# default ports 2379/2380; our tests use their own free ports, so we make sure
# no system etcd is left running (policy-rc.d usually prevents the start).
set -euo pipefail

CACHE="${CKPTDRAIN_CACHE:-$HOME/.cache/ckptdrain}"
cached="$CACHE/etcd/bin/etcd"
if [ -x "$cached" ]; then echo "$cached"; exit 0; fi

if ! command -v etcd >/dev/null 2>&1 && [ ! -x /usr/bin/etcd ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q --no-install-recommends etcd-server >&2 \
    || { $sudo apt-get update -q >&2 && $sudo apt-get install -y -q --no-install-recommends etcd-server >&2; }
  # Stop a system etcd the package may have started (it would hold 2379).
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
    $sudo systemctl disable --now etcd >&2 || true
  elif command -v service >/dev/null 2>&1; then
    $sudo service etcd stop >/dev/null 2>&1 || true
  fi
fi

bin="$(command -v etcd || echo /usr/bin/etcd)"
[ -x "$bin" ] || { echo "etcd.sh: no etcd binary after installing etcd-server" >&2; exit 1; }
echo "$bin"
