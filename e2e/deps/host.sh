#!/usr/bin/env bash
# What the real cluster and the image build need from the host, installed from
# Debian's archive when missing: one place for the list, one `apt-get update`
# before the first install (a fresh CI machine has no package lists).
#
#   host.sh [cluster|image]...   install what is missing (default: both);
#                                exits non-zero when an install fails
#   host.sh --check              can this host run the cluster at all? Exit 0
#                                if so (installs may still be needed), else
#                                exit 3 with one line on stdout saying why
#
# cluster: containerd, runc, CNI plugins, iptables, conntrack, curl, openssl
#          (e2e/cluster/up.sh); image: Docker's engine and debootstrap
#          (e2e/image/base.sh). Needs root (or sudo) to install.
set -euo pipefail

sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }

# "package:what shows it is installed" (a command name or an absolute path).
cluster_pkgs=(containerd:containerd runc:/usr/sbin/runc
  containernetworking-plugins:/usr/lib/cni/bridge iptables:iptables conntrack:conntrack
  curl:curl openssl:openssl)
image_pkgs=(docker.io:dockerd debootstrap:debootstrap)

missing_of() {
  local entry pkg probe
  for entry in "$@"; do
    pkg="${entry%%:*}" probe="${entry#*:}"
    if [[ "$probe" == /* ]]; then [ -x "$probe" ] && continue
    else command -v "$probe" >/dev/null 2>&1 && continue; fi
    echo "$pkg"
  done
}

if [ "${1:-}" = --check ]; then
  # The cluster creates a bridge, iptables chains, cgroups and mounts.
  [ "$(uname -s)" = Linux ] || { echo "the cluster needs Linux (this is $(uname -s))"; exit 3; }
  if [ "$(id -u)" != 0 ]; then echo "the cluster needs root (running as $(id -un))"; exit 3; fi
  missing=$(missing_of "${cluster_pkgs[@]}" "${image_pkgs[@]}" | tr '\n' ' ')
  if [ -n "$missing" ] && ! command -v apt-get >/dev/null; then
    echo "the cluster needs ${missing% } and there is no apt-get to install them"; exit 3
  fi
  probe="ckptchk$$"
  if ! ip link add "$probe" type bridge 2>/dev/null; then
    echo "cannot create a network bridge here (no CAP_NET_ADMIN: an unprivileged container?)"
    exit 3
  fi
  ip link del "$probe"
  exit 0
fi

wanted=()
for group in "${@:-cluster image}"; do
  for g in $group; do
    case "$g" in
      cluster) wanted+=("${cluster_pkgs[@]}") ;;
      image) wanted+=("${image_pkgs[@]}") ;;
      *) echo "host.sh: unknown group '$g' (expected cluster or image)" >&2; exit 2 ;;
    esac
  done
done
mapfile -t missing < <(missing_of "${wanted[@]}")
[ ${#missing[@]} -gt 0 ] || exit 0

command -v apt-get >/dev/null \
  || { echo "host.sh: need ${missing[*]}; install them (no apt-get here)" >&2; exit 1; }
echo "host.sh: installing ${missing[*]} from Debian" >&2
sudo_ apt-get update -q >&2
sudo_ env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
