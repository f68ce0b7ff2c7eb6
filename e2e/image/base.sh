#!/usr/bin/env bash
# Makes a local base image, ckptdrain-base:bookworm, without any image
# registry: debootstrap a minimal Debian bookworm (its python3 is 3.11, what
# the Dockerfile's default python:3.11-slim has) from the apt mirror this
# machine already uses, and `docker import` it. Cached: skipped when the image
# exists. Starts dockerd if none is running (see start_dockerd).
#
# Usage: e2e/image/base.sh            prints the image name
# Env:   BASE_IMAGE (default ckptdrain-base:bookworm), CKPTDRAIN_CACHE
set -euo pipefail

BASE_IMAGE="${BASE_IMAGE:-ckptdrain-base:bookworm}"
SUITE="${SUITE:-bookworm}"
CACHE="${CKPTDRAIN_CACHE:-$HOME/.cache/ckptdrain}"
LOGS="$CACHE/logs"
mkdir -p "$LOGS"

log() { echo "base.sh: $*" >&2; }

sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# debootstrap and Docker's engine from Debian when missing.
ensure_packages() {
  "$(dirname "${BASH_SOURCE[0]}")/../deps/host.sh" image >"$LOGS/apt-image.log" 2>&1 \
    || { cat "$LOGS/apt-image.log" >&2; exit 1; }
}

# Debian's dockerd, started by hand (no systemd here). These VMs boot cgroups
# v1, so the cgroupfs driver is the one that works; overlay2 on the ext4 root.
start_dockerd() {
  if docker info >/dev/null 2>&1; then return; fi
  if pgrep -x dockerd >/dev/null; then
    log "dockerd is running but not answering yet; waiting"
  else
    log "starting dockerd (log: $LOGS/dockerd.log)"
    # dockerd outlives this run: it must not inherit our descriptors beyond
    # stdio. Under `flock LOCK make e2e` one of them holds the e2e lock, and
    # a dockerd keeping it would hold the lock for every later run.
    (
      for fd in /proc/$BASHPID/fd/*; do
        fd=${fd##*/}
        if [ "$fd" -gt 2 ]; then eval "exec $fd>&-"; fi
      done
      run=(setsid nohup dockerd --exec-opt native.cgroupdriver=cgroupfs
           --storage-driver overlay2)
      [ "$(id -u)" = 0 ] || run=(sudo "${run[@]}")
      exec "${run[@]}" >"$LOGS/dockerd.log" 2>&1 </dev/null
    ) &
  fi
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && return
    sleep 1
  done
  log "dockerd did not come up; last lines of $LOGS/dockerd.log:"
  tail -20 "$LOGS/dockerd.log" >&2 || true
  exit 1
}

# The mirror apt already uses (deb822 .sources or one-line .list), so this
# works behind the same proxy/mirror as apt-get; the security suite is not a
# base mirror, so it is skipped.
debian_mirror() {
  local m
  m=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | awk '{print $2}' | grep -v -- '-security' | head -1 || true)
  if [ -z "$m" ]; then
    m=$(grep -hE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
          | grep -v -- '-security' | awk '{for (i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' \
          | head -1 || true)
  fi
  echo "${m:-http://deb.debian.org/debian}"
}

ensure_packages
start_dockerd

if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  echo "$BASE_IMAGE"
  exit 0
fi

mirror=$(debian_mirror)
root=$(mktemp -d "${TMPDIR:-/tmp}/ckptdrain-rootfs.XXXXXX")
trap 'sudo_ rm -rf "$root"' EXIT
log "debootstrap $SUITE from $mirror (about a minute)"
start=$(date +%s)
sudo_ debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  "$SUITE" "$root" "$mirror" >"$LOGS/debootstrap.log" 2>&1 \
  || { tail -30 "$LOGS/debootstrap.log" >&2; exit 1; }
# Dead weight in a runtime image (~50 MB of 170): apt's lists and package
# cache, documentation (but not the copyright files, which the licences ask
# us to ship), man pages and translations (the image logs in English). The
# dpkg excludes keep them out if a later stage installs more.
sudo_ rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
  "$root"/usr/share/man/* "$root"/usr/share/info/* \
  "$root"/usr/share/locale/* "$root"/usr/share/lintian "$root"/var/cache/debconf/*-old
sudo_ find "$root/usr/share/doc" -type f ! -name copyright -delete
sudo_ find "$root/usr/share/doc" -type l -delete
sudo_ tee "$root/etc/dpkg/dpkg.cfg.d/01-ckptdrain-nodoc" >/dev/null <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
CFG
sudo_ tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' \
  - "$BASE_IMAGE" >/dev/null
log "built $BASE_IMAGE in $(( $(date +%s) - start ))s"
echo "$BASE_IMAGE"
